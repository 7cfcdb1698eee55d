//! Go `time.Duration` strings as `metav1.Duration` fields hold them (`24h0m0s`, `4m`,
//! `1h30m`, `1.5s`): the KubeVirt resource's certificate lifetimes and batch intervals, the
//! freeze action's unfreeze timeout. Parsed here, with the API types, so that every
//! component reads them alike.

use std::time::Duration;

/// Parses a Go duration: a sequence of decimal numbers, each with an optional fraction and a
/// unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`); `0` alone is zero, a leading `+` is allowed.
/// humantime does the arithmetic; its extra units (days, months, words) and spaces are
/// refused first, as Go refuses them. Negative durations are refused: no field of ours
/// takes one.
pub fn parse(s: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {s:?}");
    let body = s.strip_prefix('+').unwrap_or(s);
    if body.starts_with('-') {
        return Err(format!("must be positive, got {s:?}"));
    }
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    // U+03BC (Greek mu) is Go's other spelling of U+00B5 (micro sign).
    let body = body.replace('\u{3bc}', "\u{b5}");
    let go_chars =
        |c: char| c.is_ascii_digit() || matches!(c, '.' | 'n' | 'u' | '\u{b5}' | 'm' | 's' | 'h');
    if body.is_empty() || !body.chars().all(go_chars) {
        return Err(invalid());
    }
    humantime::parse_duration(&body).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_spellings_parse_and_others_do_not() {
        let ok = [
            ("24h0m0s", Duration::from_secs(86_400)),
            ("4m", Duration::from_secs(240)),
            ("1m30.5s", Duration::from_millis(90_500)),
            ("2\u{3bc}s", Duration::from_micros(2)),
            ("+1h", Duration::from_secs(3600)),
            ("0", Duration::ZERO),
        ];
        for (s, want) in ok {
            assert_eq!(parse(s), Ok(want), "{s}");
        }
        for bad in ["x", "", "5", "1h1", "2d", "1 h", "1min"] {
            assert_eq!(
                parse(bad),
                Err(format!("invalid duration {bad:?}")),
                "{bad}"
            );
        }
        assert_eq!(parse("-1h"), Err("must be positive, got \"-1h\"".into()));
    }
}
