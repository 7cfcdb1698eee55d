//! Certificate lifetimes: `spec.certificateRotateStrategy.selfSigned` of the KubeVirt resource
//! parsed and validated into a [`CertPolicy`] (pure; no I/O).
//!
//! The fields are KubeVirt's: `ca` and `server`, each `{duration, renewBefore}` as Go
//! `metav1.Duration` strings (`24h0m0s`, `4m`, `1h30m`), plus the deprecated
//! `caRotateInterval` (= `ca.duration`), `certRotateInterval` (= `server.duration`) and
//! `caOverlapInterval` (= `ca.renewBefore`). As in KubeVirt, the deprecated fields may not be
//! mixed with `ca`/`server`, `renewBefore` must be shorter than `duration`, and certificates
//! may not outlive their CA's duration.

use kubevirt_api::kubevirt::KubeVirtCertificateRotateStrategy;
use time::{Duration, OffsetDateTime};

/// Lifetime of a CA when `ca.duration` is not set.
pub const DEFAULT_CA_DURATION: Duration = Duration::days(365);
/// Lifetime of serving and client certificates when `server.duration` is not set.
pub const DEFAULT_SERVER_DURATION: Duration = Duration::days(30);
/// How long a new CA is in every trust bundle before certificates are signed with it:
/// kubelet refreshes mounted Secret volumes within about 1–2 minutes, and virt-apiserver and
/// virt-handler re-read their files when they change.
pub const PROPAGATION_DELAY: Duration = Duration::minutes(5);
/// A certificate that lives longer than this beyond its configured duration was issued under a
/// longer duration (the strategy was shortened since): it is renewed at once.
const LONGER_THAN_CONFIGURED: Duration = Duration::minutes(1);
/// Where the fields live in the KubeVirt resource (for error messages).
pub const FIELD: &str = "spec.certificateRotateStrategy.selfSigned";

/// Lifetime and renewal point of one kind of certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// Validity of a newly issued certificate.
    pub duration: Duration,
    /// How long before `notAfter` the certificate is renewed.
    pub renew_before: Duration,
}

impl Lifetime {
    /// `duration` with `renewBefore` defaulted to 20 % of it.
    pub fn with_default_renewal(duration: Duration) -> Self {
        Self {
            duration,
            renew_before: duration / 5,
        }
    }

    /// When a certificate valid `not_before..not_after` is to be renewed.
    pub fn next_due(
        &self,
        _not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> OffsetDateTime {
        not_after - self.renew_before
    }

    /// Whether a certificate valid `not_before..not_after` must be renewed at `now`: its renewal
    /// point has come, it is not valid yet (the clock went back), or it lives longer than the
    /// configured duration allows (issued before the duration was shortened).
    pub fn due(
        &self,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
        now: OffsetDateTime,
    ) -> bool {
        now < not_before
            || now >= self.next_due(not_before, not_after)
            || not_after - now > self.duration + LONGER_THAN_CONFIGURED
    }
}

/// Lifetimes of the CAs and of the certificates they sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertPolicy {
    pub ca: Lifetime,
    pub server: Lifetime,
}

impl Default for CertPolicy {
    fn default() -> Self {
        Self {
            ca: Lifetime::with_default_renewal(DEFAULT_CA_DURATION),
            server: Lifetime::with_default_renewal(DEFAULT_SERVER_DURATION),
        }
    }
}

impl CertPolicy {
    /// The leaf lifetime as applied: `renewBefore` at most half the CA's, so that a leaf issued
    /// late in its CA's life (its `notAfter` is cut at the CA's) is never due the moment it is
    /// issued; such a leaf is replaced when the CA rotates.
    pub fn leaf(&self) -> Lifetime {
        Lifetime {
            duration: self.server.duration,
            renew_before: std::cmp::min(self.server.renew_before, self.ca.renew_before / 2),
        }
    }

    /// How long a new CA is published before leaves are signed with it: [`PROPAGATION_DELAY`],
    /// or half the CA's `renewBefore` when that is shorter (the old CA must still be valid when
    /// the leaves switch).
    pub fn propagation_delay(&self) -> Duration {
        std::cmp::min(PROPAGATION_DELAY, self.ca.renew_before / 2)
    }

    /// The policy a KubeVirt resource asks for; every invalid field is reported.
    pub fn from_spec(
        spec: Option<&KubeVirtCertificateRotateStrategy>,
    ) -> Result<Self, PolicyError> {
        let Some(s) = spec.and_then(|s| s.self_signed.as_ref()) else {
            return Ok(Self::default());
        };
        let mut errors = Vec::new();
        let deprecated = s.ca_rotate_interval.is_some()
            || s.cert_rotate_interval.is_some()
            || s.ca_overlap_interval.is_some();
        if deprecated && (s.ca.is_some() || s.server.is_some()) {
            errors.push(FieldError::new(
                FIELD,
                "caRotateInterval, certRotateInterval and caOverlapInterval are deprecated and \
                 conflict with ca and server",
            ));
        }
        let ca = s.ca.as_ref();
        let server = s.server.as_ref();
        let mut field =
            |name: &'static str, value: Option<&String>| -> Option<(Duration, String)> {
                let value = value?;
                let path = format!("{FIELD}.{name}");
                match parse_duration(value) {
                    Ok(d) if d.is_positive() => Some((d, path)),
                    Ok(_) => {
                        errors.push(FieldError::new(
                            &path,
                            &format!("must be positive, got {value:?}"),
                        ));
                        None
                    }
                    Err(e) => {
                        errors.push(FieldError::new(&path, &e));
                        None
                    }
                }
            };
        let ca_duration = field("ca.duration", ca.and_then(|c| c.duration.as_ref()))
            .or_else(|| field("caRotateInterval", s.ca_rotate_interval.as_ref()));
        let ca_renew = field("ca.renewBefore", ca.and_then(|c| c.renew_before.as_ref()))
            .or_else(|| field("caOverlapInterval", s.ca_overlap_interval.as_ref()));
        let server_duration = field("server.duration", server.and_then(|c| c.duration.as_ref()))
            .or_else(|| field("certRotateInterval", s.cert_rotate_interval.as_ref()));
        let server_renew = field(
            "server.renewBefore",
            server.and_then(|c| c.renew_before.as_ref()),
        );

        let ca_d = ca_duration
            .as_ref()
            .map_or(DEFAULT_CA_DURATION, |(d, _)| *d);
        let ca_rb = ca_renew.as_ref().map_or(ca_d / 5, |(d, _)| *d);
        // Unset, the server duration never exceeds the CA's.
        let server_d = server_duration
            .as_ref()
            .map_or(std::cmp::min(DEFAULT_SERVER_DURATION, ca_d), |(d, _)| *d);
        let server_rb = server_renew.as_ref().map_or(server_d / 5, |(d, _)| *d);
        if let Some((_, path)) = &ca_renew
            && ca_rb >= ca_d
        {
            errors.push(FieldError::new(
                path,
                &format!(
                    "must be less than the CA's duration ({} >= {})",
                    go_duration(ca_rb),
                    go_duration(ca_d)
                ),
            ));
        }
        if let Some((_, path)) = &server_renew
            && server_rb >= server_d
        {
            errors.push(FieldError::new(
                path,
                &format!(
                    "must be less than the certificates' duration ({} >= {})",
                    go_duration(server_rb),
                    go_duration(server_d)
                ),
            ));
        }
        if let Some((_, path)) = &server_duration
            && server_d > ca_d
        {
            errors.push(FieldError::new(
                path,
                &format!(
                    "certificates cannot outlive their CA ({} > CA duration {})",
                    go_duration(server_d),
                    go_duration(ca_d)
                ),
            ));
        }
        if errors.is_empty() {
            Ok(Self {
                ca: Lifetime {
                    duration: ca_d,
                    renew_before: ca_rb,
                },
                server: Lifetime {
                    duration: server_d,
                    renew_before: server_rb,
                },
            })
        } else {
            Err(PolicyError(errors))
        }
    }
}

/// One invalid field of the KubeVirt resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    fn new(field: &str, message: &str) -> Self {
        Self {
            field: field.to_string(),
            message: message.to_string(),
        }
    }
}

/// Every invalid field of `spec.certificateRotateStrategy`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct PolicyError(pub Vec<FieldError>);

/// Parses a Go `time.Duration` string as `metav1.Duration` holds it
/// ([`kubevirt_api::duration::parse`]), as the signed duration the policy computes with.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = kubevirt_api::duration::parse(s)?;
    Duration::try_from(d).map_err(|_| format!("invalid duration {s:?}"))
}

/// A duration the way Go prints one (`720h0m0s`, `4m0s`, `1.5s`), for messages.
pub fn go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    let sign = if d.is_negative() { "-" } else { "" };
    let d = d.abs();
    let total = d.whole_seconds();
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    let nanos = d.subsec_nanoseconds();
    let secs = if nanos == 0 {
        format!("{s}")
    } else {
        let frac = format!("{nanos:09}");
        format!("{s}.{}", frac.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{sign}{h}h{m}m{secs}s")
    } else if m > 0 {
        format!("{sign}{m}m{secs}s")
    } else {
        format!("{sign}{secs}s")
    }
}

#[cfg(test)]
impl CertPolicy {
    /// Leaves renewed 30 min before their end under a CA renewed only 6 min before its own:
    /// the case the caps of [`CertPolicy::leaf`] and the propagation delay exist for.
    pub(crate) fn short_ca_long_leaf_renewal() -> Self {
        CertPolicy {
            ca: Lifetime {
                duration: Duration::hours(2),
                renew_before: Duration::minutes(6),
            },
            server: Lifetime {
                duration: Duration::hours(1),
                renew_before: Duration::minutes(30),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kubevirt_api::kubevirt::{CertConfig, KubeVirtSelfSignConfiguration};

    fn strategy(s: KubeVirtSelfSignConfiguration) -> KubeVirtCertificateRotateStrategy {
        KubeVirtCertificateRotateStrategy {
            self_signed: Some(s),
        }
    }

    fn cfg(duration: Option<&str>, renew: Option<&str>) -> Option<CertConfig> {
        Some(CertConfig {
            duration: duration.map(str::to_string),
            renew_before: renew.map(str::to_string),
        })
    }

    #[test]
    fn go_durations_parse() {
        let ok = [
            ("24h0m0s", Duration::hours(24)),
            ("4m", Duration::minutes(4)),
            ("1h30m", Duration::minutes(90)),
            ("50s", Duration::seconds(50)),
            ("1.5h", Duration::minutes(90)),
            ("1m30.5s", Duration::milliseconds(90_500)),
            ("300ms", Duration::milliseconds(300)),
            ("2us", Duration::microseconds(2)),
            ("2µs", Duration::microseconds(2)),
            ("2\u{3bc}s", Duration::microseconds(2)),
            ("+1h", Duration::hours(1)),
            ("8760h0m0s", Duration::days(365)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
        ];
        for (s, want) in ok {
            assert_eq!(parse_duration(s), Ok(want), "{s}");
        }
        for bad in [
            "x", "", "5", "1h1", "h", "2d", "1w", "1M", "1 h", "1h 30m", "1min", "1hr", "1y",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert_eq!(e, format!("invalid duration {bad:?}"), "{bad}");
        }
        assert_eq!(
            parse_duration("-1h").unwrap_err(),
            "must be positive, got \"-1h\""
        );
    }

    #[test]
    fn go_duration_prints_like_go() {
        assert_eq!(go_duration(Duration::days(30)), "720h0m0s");
        assert_eq!(go_duration(Duration::minutes(4)), "4m0s");
        assert_eq!(go_duration(Duration::seconds(50)), "50s");
        assert_eq!(go_duration(Duration::milliseconds(1500)), "1.5s");
        assert_eq!(go_duration(Duration::ZERO), "0s");
        for d in [
            Duration::days(365),
            Duration::minutes(90),
            Duration::milliseconds(61_250),
        ] {
            assert_eq!(parse_duration(&go_duration(d)), Ok(d));
        }
    }

    #[test]
    fn defaults_ca_a_year_leaves_30_days_renewal_at_20_percent() {
        let p = CertPolicy::from_spec(None).unwrap();
        assert_eq!(p, CertPolicy::default());
        assert_eq!(p.ca.duration, Duration::days(365));
        assert_eq!(p.ca.renew_before, Duration::days(73));
        assert_eq!(p.server.duration, Duration::days(30));
        assert_eq!(p.server.renew_before, Duration::days(6));
        assert_eq!(p.leaf(), p.server);
        assert_eq!(p.propagation_delay(), PROPAGATION_DELAY);
        // An empty strategy is the defaults too.
        let empty = KubeVirtCertificateRotateStrategy::default();
        assert_eq!(CertPolicy::from_spec(Some(&empty)).unwrap(), p);
        let empty = strategy(KubeVirtSelfSignConfiguration::default());
        assert_eq!(CertPolicy::from_spec(Some(&empty)).unwrap(), p);
    }

    #[test]
    fn current_fields_and_their_defaults() {
        let s = strategy(KubeVirtSelfSignConfiguration {
            server: cfg(Some("4m"), Some("3m")),
            ..Default::default()
        });
        let p = CertPolicy::from_spec(Some(&s)).unwrap();
        assert_eq!(p.server.duration, Duration::minutes(4));
        assert_eq!(p.server.renew_before, Duration::minutes(3));
        assert_eq!(p.ca, Lifetime::with_default_renewal(DEFAULT_CA_DURATION));

        let s = strategy(KubeVirtSelfSignConfiguration {
            ca: cfg(Some("48h"), None),
            server: cfg(Some("24h0m0s"), None),
            ..Default::default()
        });
        let p = CertPolicy::from_spec(Some(&s)).unwrap();
        assert_eq!(p.ca.renew_before, Duration::minutes(48 * 60 / 5));
        assert_eq!(p.server.renew_before, Duration::minutes(24 * 60 / 5));

        // Only a short CA: the default server duration is cut to it.
        let s = strategy(KubeVirtSelfSignConfiguration {
            ca: cfg(Some("1h"), None),
            ..Default::default()
        });
        let p = CertPolicy::from_spec(Some(&s)).unwrap();
        assert_eq!(p.server.duration, Duration::hours(1));
        assert_eq!(p.server.renew_before, Duration::minutes(12));
    }

    #[test]
    fn deprecated_fields_map_onto_ca_and_server() {
        let s = strategy(KubeVirtSelfSignConfiguration {
            ca_rotate_interval: Some("168h".into()),
            cert_rotate_interval: Some("24h".into()),
            ca_overlap_interval: Some("24h".into()),
            ..Default::default()
        });
        let p = CertPolicy::from_spec(Some(&s)).unwrap();
        assert_eq!(
            p.ca,
            Lifetime {
                duration: Duration::days(7),
                renew_before: Duration::days(1)
            }
        );
        assert_eq!(p.server, Lifetime::with_default_renewal(Duration::days(1)));
    }

    #[test]
    fn invalid_fields_are_named() {
        let err = |s: KubeVirtSelfSignConfiguration| {
            CertPolicy::from_spec(Some(&strategy(s)))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(KubeVirtSelfSignConfiguration {
                server: cfg(Some("x"), None),
                ..Default::default()
            }),
            "spec.certificateRotateStrategy.selfSigned.server.duration: invalid duration \"x\""
        );
        assert_eq!(
            err(KubeVirtSelfSignConfiguration {
                server: cfg(Some("1m"), Some("1m")),
                ..Default::default()
            }),
            "spec.certificateRotateStrategy.selfSigned.server.renewBefore: must be less than the \
             certificates' duration (1m0s >= 1m0s)"
        );
        assert_eq!(
            err(KubeVirtSelfSignConfiguration {
                ca: cfg(Some("1h"), Some("2h")),
                ..Default::default()
            }),
            "spec.certificateRotateStrategy.selfSigned.ca.renewBefore: must be less than the CA's \
             duration (2h0m0s >= 1h0m0s)"
        );
        assert_eq!(
            err(KubeVirtSelfSignConfiguration {
                ca: cfg(Some("1h"), None),
                server: cfg(Some("2h"), None),
                ..Default::default()
            }),
            "spec.certificateRotateStrategy.selfSigned.server.duration: certificates cannot \
             outlive their CA (2h0m0s > CA duration 1h0m0s)"
        );
        assert_eq!(
            err(KubeVirtSelfSignConfiguration {
                server: cfg(Some("0s"), None),
                ..Default::default()
            }),
            "spec.certificateRotateStrategy.selfSigned.server.duration: must be positive, got \"0s\""
        );
        let e = err(KubeVirtSelfSignConfiguration {
            ca_rotate_interval: Some("48h".into()),
            server: cfg(Some("1h"), Some("bad")),
            ..Default::default()
        });
        assert!(e.contains("selfSigned: caRotateInterval, certRotateInterval and caOverlapInterval are deprecated"), "{e}");
        assert!(
            e.contains("selfSigned.server.renewBefore: invalid duration \"bad\""),
            "{e}"
        );
        let e = err(KubeVirtSelfSignConfiguration {
            ca_overlap_interval: Some("400d".into()),
            ..Default::default()
        });
        assert_eq!(
            e,
            "spec.certificateRotateStrategy.selfSigned.caOverlapInterval: invalid duration \"400d\""
        );
    }

    #[test]
    fn due_at_renew_before_not_after() {
        let l = Lifetime {
            duration: Duration::minutes(4),
            renew_before: Duration::minutes(3),
        };
        let t0 = OffsetDateTime::UNIX_EPOCH + Duration::days(20_000);
        // As issued: valid from 5 minutes back (clock skew allowance) for 4 minutes.
        let (nb, na) = (t0 - Duration::minutes(5), t0 + Duration::minutes(4));
        assert_eq!(l.next_due(nb, na), t0 + Duration::minutes(1));
        assert!(!l.due(nb, na, t0));
        assert!(!l.due(nb, na, t0 + Duration::seconds(59)));
        assert!(l.due(nb, na, t0 + Duration::minutes(1)));
        assert!(l.due(nb, na, na + Duration::seconds(1)), "expired");
        assert!(l.due(nb, na, nb - Duration::seconds(1)), "not valid yet");
        // Issued under a 30-day duration: renewed at once under the 4-minute one.
        assert!(l.due(nb, t0 + Duration::days(30), t0));

        let p = CertPolicy::default();
        let (nb, na) = (t0, t0 + Duration::days(365));
        assert!(!p.ca.due(nb, na, t0 + Duration::days(291)));
        assert!(p.ca.due(nb, na, t0 + Duration::days(292)));
    }

    #[test]
    fn leaf_renewal_and_delay_stay_within_the_cas() {
        // renewBefore of leaves longer than half the CA's: cut, so that a leaf cut at its
        // CA's notAfter is not due when issued.
        let p = CertPolicy::short_ca_long_leaf_renewal();
        assert_eq!(p.leaf().renew_before, Duration::minutes(3));
        assert_eq!(p.propagation_delay(), Duration::minutes(3));
    }
}
