//! API requests by verb and resource from `apiserver_request_total` (Prometheus text), the
//! difference between two scrapes, and which of them failed. Pure.

use std::collections::BTreeMap;

const METRIC: &str = "apiserver_request_total";

/// What a request counter is keyed by here (the other labels are summed over).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub verb: String,
    /// `pods`, `virtualmachineinstances/status`: the resource with its subresource.
    pub resource: String,
    /// `kubevirt.io`, or empty for the core group (and for virt-apiserver, which has none).
    pub group: String,
    pub code: String,
}

/// Counts by [`Key`].
pub type Counts = BTreeMap<Key, f64>;

/// The label `name` of a sample's label set (`a="x",b="y"`); label values here hold no
/// commas or quotes.
fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|p| {
            let (k, v) = p.split_once('=')?;
            (k.trim() == name).then(|| v.trim().trim_matches('"'))
        })
        .unwrap_or("")
}

/// Every `apiserver_request_total` sample of `text`, summed by [`Key`].
pub fn parse(text: &str) -> Counts {
    let mut out = Counts::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(METRIC) else {
            continue;
        };
        let Some((labels, value)) = rest.strip_prefix('{').and_then(|r| r.rsplit_once('}')) else {
            continue;
        };
        let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let sub = label(labels, "subresource");
        let resource = match (label(labels, "resource"), sub) {
            ("", _) => "(none)".to_string(),
            (r, "") => r.to_string(),
            (r, s) => format!("{r}/{s}"),
        };
        let key = Key {
            verb: label(labels, "verb").to_string(),
            resource,
            group: label(labels, "group").to_string(),
            code: label(labels, "code").to_string(),
        };
        *out.entry(key).or_default() += v;
    }
    out
}

/// `after - before`, keys that did not move left out.
pub fn diff(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a - before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

/// How a response code counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// 409: a lost compare-and-swap or an AlreadyExists, which clients expect and retry.
    Conflict,
    /// A GET of an object that does not exist (yet).
    NotFound,
    Failed,
}

pub fn outcome(code: &str) -> Outcome {
    match code {
        "409" => Outcome::Conflict,
        c if c.starts_with('2') => Outcome::Ok,
        // A watch ends with code 0 in some versions when its client goes away; 304 is a
        // discovery document the client already has.
        "0" | "304" => Outcome::Ok,
        _ => Outcome::Failed,
    }
}

/// How a request counts: [`outcome`] of its code, except that a GET answered 404 is a
/// lookup that found nothing (`get_opt`: does this VM have its VMI yet?), not a failure.
pub fn outcome_of(key: &Key) -> Outcome {
    if key.code == "404" && key.verb.eq_ignore_ascii_case("get") {
        Outcome::NotFound
    } else {
        outcome(&key.code)
    }
}

/// Requests by verb and resource (codes summed), excluding `skip_group`'s rows (the
/// aggregated group, which kube-apiserver only proxies), sorted by count descending.
pub fn by_verb(counts: &Counts, skip_group: Option<&str>) -> Vec<(String, String, f64)> {
    let mut m: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (k, v) in counts {
        if skip_group.is_some_and(|g| g == k.group) {
            continue;
        }
        *m.entry((k.verb.clone(), k.resource.clone())).or_default() += v;
    }
    let mut rows: Vec<_> = m.into_iter().map(|((v, r), n)| (v, r, n)).collect();
    rows.sort_by(|a, b| {
        b.2.total_cmp(&a.2)
            .then_with(|| (&a.0, &a.1).cmp(&(&b.0, &b.1)))
    });
    rows
}

/// Total of the requests with `outcome`.
pub fn total(counts: &Counts, want: Outcome) -> f64 {
    counts
        .iter()
        .filter(|(k, _)| outcome_of(k) == want)
        // Not `sum()`: an empty f64 sum is -0.0.
        .fold(0.0, |a, (_, v)| a + v)
}

/// `verb resource code: n` for each key with `want`, for the report.
pub fn listed(counts: &Counts, want: Outcome) -> Vec<String> {
    counts
        .iter()
        .filter(|(k, _)| outcome_of(k) == want)
        .map(|(k, v)| format!("{} {} {}: {v:.0}", k.verb, k.resource, k.code))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBE: &str = "# HELP apiserver_request_total x\n\
        # TYPE apiserver_request_total counter\n\
        apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 10\n\
        apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"binding\",verb=\"POST\",version=\"v1\"} 10\n\
        apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 20\n\
        apiserver_request_total{code=\"409\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 1\n\
        apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"kubevirt.io\",resource=\"virtualmachines\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 3\n\
        apiserver_request_total{code=\"500\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"nodes\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 2\n\
        apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"\",scope=\"\",subresource=\"/readyz\",verb=\"GET\",version=\"\"} 4\n\
        apiserver_request_duration_seconds_bucket{le=\"1\"} 99\n";

    #[test]
    fn samples_are_keyed_by_verb_resource_group_code() {
        let c = parse(KUBE);
        let k = |verb: &str, res: &str, group: &str, code: &str| Key {
            verb: verb.into(),
            resource: res.into(),
            group: group.into(),
            code: code.into(),
        };
        assert_eq!(c.get(&k("POST", "pods/binding", "", "201")), Some(&10.0));
        assert_eq!(c.get(&k("PATCH", "pods/status", "", "409")), Some(&1.0));
        assert_eq!(
            c.get(&k("GET", "virtualmachines", "kubevirt.io", "200")),
            Some(&3.0)
        );
        assert_eq!(c.get(&k("GET", "(none)", "", "200")), Some(&4.0));
        assert_eq!(c.len(), 7);
        // virt-apiserver's samples carry no group.
        let ours = parse(
            "apiserver_request_total{verb=\"patch\",resource=\"virtualmachineinstances\",subresource=\"status\",code=\"200\"} 5\n",
        );
        assert_eq!(
            ours.get(&k("patch", "virtualmachineinstances/status", "", "200")),
            Some(&5.0)
        );
    }

    #[test]
    fn differences_rows_and_failures() {
        let before = parse(KUBE);
        let after = parse(&KUBE.replace("} 10\n", "} 30\n").replace("} 2\n", "} 3\n"));
        let d = diff(&before, &after);
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!(total(&d, Outcome::Ok), 40.0);
        assert_eq!(total(&d, Outcome::Failed), 1.0);
        assert_eq!(listed(&d, Outcome::Failed), ["GET nodes 500: 1"]);
        let all = parse(KUBE);
        let rows = by_verb(&all, Some("kubevirt.io"));
        assert_eq!(rows[0], ("PATCH".into(), "pods/status".into(), 21.0));
        assert!(rows.iter().all(|r| r.1 != "virtualmachines"));
        assert_eq!(outcome("409"), Outcome::Conflict);
        assert_eq!(outcome("201"), Outcome::Ok);
        assert_eq!(outcome("429"), Outcome::Failed);
        assert_eq!(outcome("304"), Outcome::Ok);
        let get404 = Key {
            verb: "get".into(),
            resource: "virtualmachineinstances".into(),
            group: String::new(),
            code: "404".into(),
        };
        assert_eq!(outcome_of(&get404), Outcome::NotFound);
        let patch404 = Key {
            verb: "PATCH".into(),
            ..get404
        };
        assert_eq!(outcome_of(&patch404), Outcome::Failed);
    }
}
