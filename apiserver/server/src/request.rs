//! Pure request parsing: RequestInfo exactly as kube-apiserver derives authorization
//! attributes, media-type negotiation, and query parameters.

use std::collections::HashMap;

/// Authorization attributes of a request (kube-apiserver's RequestInfo).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestInfo {
    /// `/apis/G/V/...` with at least a resource.
    pub is_resource: bool,
    /// The path.
    pub path: String,
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// API group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Namespace, empty for all namespaces.
    pub namespace: String,
    /// Resource plural.
    pub resource: String,
    /// Subresource (single segment after the name).
    pub subresource: String,
    /// Object name.
    pub name: String,
    /// Segments after the subresource (e.g. portforward port).
    pub rest: Vec<String>,
    /// The path names a collection. `name` may still be set for authorization, from a
    /// `metadata.name` field selector, as kube-apiserver does.
    pub is_collection: bool,
}

/// Parses method, path and query into a RequestInfo.
pub fn request_info(method: &str, path: &str, query: &Query) -> RequestInfo {
    let mut info = RequestInfo {
        path: path.to_string(),
        verb: method.to_ascii_lowercase(),
        ..Default::default()
    };
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    if parts.len() < 4 || parts[0] != "apis" {
        return info;
    }
    info.is_resource = true;
    info.group = parts[1].to_string();
    info.version = parts[2].to_string();
    let mut rest = &parts[3..];
    let mut watch_prefix = false;
    if rest.first() == Some(&"watch") {
        watch_prefix = true;
        rest = &rest[1..];
    }
    if rest.len() >= 2 && rest[0] == "namespaces" {
        info.namespace = rest[1].to_string();
        rest = &rest[2..];
        if rest.is_empty() {
            // `/namespaces/{ns}` itself: the namespace is the resource.
            info.resource = "namespaces".into();
            info.name = info.namespace.clone();
            info.namespace.clear();
        }
    }
    if let Some(r) = rest.first() {
        info.resource = r.to_string();
    }
    if let Some(n) = rest.get(1) {
        info.name = n.to_string();
    }
    info.is_collection = info.name.is_empty();
    if let Some(s) = rest.get(2) {
        info.subresource = s.to_string();
    }
    info.rest = rest.iter().skip(3).map(|s| s.to_string()).collect();
    info.verb = match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        other => {
            return RequestInfo {
                verb: other.to_ascii_lowercase(),
                ..info
            };
        }
    }
    .to_string();
    if watch_prefix {
        info.verb = "watch".into();
    } else if info.name.is_empty() && info.verb == "get" {
        info.verb = if query.flag("watch") { "watch" } else { "list" }.into();
    } else if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".into();
    }
    if matches!(info.verb.as_str(), "list" | "watch")
        && let Some(fs) = query.get("fieldSelector")
        && let Some(name) = fs.split(',').find_map(|r| {
            r.strip_prefix("metadata.name=")
                .or_else(|| r.strip_prefix("metadata.name=="))
        })
        && !fs.contains(',')
    {
        info.name = name.to_string();
    }
    info
}

/// Query parameters (last value wins; kube-apiserver rejects repeats of most, we keep it simple).
#[derive(Debug, Clone, Default)]
pub struct Query {
    map: HashMap<String, String>,
}

impl Query {
    /// Parses a raw query string.
    pub fn parse(raw: Option<&str>) -> Self {
        let map = raw
            .map(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Self { map }
    }

    /// A parameter's value.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.map.get(k).map(String::as_str)
    }

    /// A boolean parameter: present and not `false`/`0`.
    pub fn flag(&self, k: &str) -> bool {
        self.get(k).is_some_and(|v| v != "false" && v != "0")
    }

    /// An optional boolean parameter, `Err` on garbage.
    pub fn bool(&self, k: &str) -> Result<Option<bool>, String> {
        match self.get(k) {
            None | Some("") => Ok(None),
            Some("true") | Some("1") => Ok(Some(true)),
            Some("false") | Some("0") => Ok(Some(false)),
            Some(v) => Err(format!(
                "invalid value for {k}: {v:?}, expected true or false"
            )),
        }
    }

    /// An optional integer parameter, `Err` on garbage.
    /// An empty value is garbage too, as kube-apiserver has it.
    pub fn int(&self, k: &str) -> Result<Option<i64>, String> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("invalid value for {k}: {v:?}, expected an integer")),
        }
    }
}

/// One clause of an Accept header.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaRange {
    /// `application`.
    pub type_: String,
    /// `json`.
    pub subtype: String,
    /// Parameters other than q, lower-cased keys.
    pub params: HashMap<String, String>,
    /// Quality.
    pub q: f32,
}

impl MediaRange {
    /// A parameter value.
    pub fn param(&self, k: &str) -> Option<&str> {
        self.params.get(k).map(String::as_str)
    }

    /// Whether this range accepts `application/<subtype>`.
    pub fn accepts(&self, subtype: &str) -> bool {
        (self.type_ == "*" || self.type_ == "application")
            && (self.subtype == "*" || self.subtype == subtype)
    }
}

/// Parses an Accept header and orders clauses by q, then specificity (goautoneg).
pub fn parse_accept(header: Option<&str>) -> Vec<MediaRange> {
    let Some(h) = header.filter(|h| !h.trim().is_empty()) else {
        return vec![MediaRange {
            type_: "application".into(),
            subtype: "json".into(),
            params: HashMap::new(),
            q: 1.0,
        }];
    };
    let mut out: Vec<MediaRange> = h
        .split(',')
        .filter_map(|clause| {
            let mut parts = clause.split(';').map(str::trim);
            let (t, s) = parts.next()?.split_once('/')?;
            let mut params = HashMap::new();
            let mut q = 1.0f32;
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    let k = k.trim().to_ascii_lowercase();
                    let v = v.trim().trim_matches('"').to_string();
                    if k == "q" {
                        q = v.parse().unwrap_or(0.0);
                    } else {
                        params.insert(k, v);
                    }
                }
            }
            Some(MediaRange {
                type_: t.trim().to_ascii_lowercase(),
                subtype: s.trim().to_ascii_lowercase(),
                params,
                q,
            })
        })
        .filter(|m| m.q > 0.0)
        .collect();
    out.sort_by(|a, b| {
        b.q.partial_cmp(&a.q)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| {
                let spec = |m: &MediaRange| (m.type_ != "*") as u8 + (m.subtype != "*") as u8;
                spec(b).cmp(&spec(a))
            })
    });
    out
}

/// How an API object response is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Plain object or list.
    Object { yaml: bool },
    /// meta.k8s.io Table.
    Table { yaml: bool },
    /// PartialObjectMetadata(List).
    Metadata { yaml: bool },
}

impl Output {
    /// YAML rather than JSON.
    pub fn yaml(self) -> bool {
        match self {
            Output::Object { yaml } | Output::Table { yaml } | Output::Metadata { yaml } => yaml,
        }
    }
}

/// Chooses the output for a resource response; `list` tells list from single object.
/// `Err` carries the 406 message.
pub fn negotiate(accept: &[MediaRange], list: bool) -> Result<Output, String> {
    for m in accept {
        let yaml = if m.accepts("json") {
            m.subtype == "yaml"
        } else if m.accepts("yaml") {
            true
        } else {
            continue;
        };
        match m.param("as") {
            None => return Ok(Output::Object { yaml }),
            Some("Table")
                if matches!(m.param("g"), Some("meta.k8s.io"))
                    && matches!(m.param("v"), Some("v1" | "v1beta1")) =>
            {
                return Ok(Output::Table { yaml });
            }
            Some("PartialObjectMetadata")
                if !list && matches!(m.param("g"), Some("meta.k8s.io")) =>
            {
                return Ok(Output::Metadata { yaml });
            }
            Some("PartialObjectMetadataList")
                if list && matches!(m.param("g"), Some("meta.k8s.io")) =>
            {
                return Ok(Output::Metadata { yaml });
            }
            Some(_) => continue,
        }
    }
    let pom_mismatch = accept.iter().any(|m| match m.param("as") {
        Some("PartialObjectMetadata") => list,
        Some("PartialObjectMetadataList") => !list,
        _ => false,
    });
    if pom_mismatch {
        return Err(if list {
            "you requested PartialObjectMetadata, but the requested object is a list (*v1.PartialObjectMetadataList)".into()
        } else {
            "you requested PartialObjectMetadataList, but the requested object is not a list (*v1.PartialObjectMetadata)".into()
        });
    }
    Err("only the following media types are accepted: application/json, application/yaml".into())
}

/// Human-readable age as kubectl shows it (apimachinery's HumanDuration rules).
pub fn human_duration(secs: i64) -> String {
    if secs < 0 {
        return "<invalid>".into();
    }
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        let s = secs % 60;
        if s == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{s}s")
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        let mm = m % 60;
        if mm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{mm}m")
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        let hh = h % 24;
        if hh == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{hh}h")
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else if d < 365 * 8 {
        let dd = d % 365;
        if dd == 0 {
            format!("{}y", d / 365)
        } else {
            format!("{}y{dd}d", d / 365)
        }
    } else {
        format!("{}y", d / 365)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, path_q: &str) -> RequestInfo {
        let (p, q) = path_q
            .split_once('?')
            .map(|(a, b)| (a, Some(b)))
            .unwrap_or((path_q, None));
        request_info(method, p, &Query::parse(q))
    }

    #[test]
    fn request_info_matches_kube_apiserver_table() {
        let i = info("GET", "/apis/kubevirt.io/v1/namespaces/d/virtualmachines");
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str(), i.resource.as_str()),
            ("list", "d", "virtualmachines")
        );
        let i = info(
            "GET",
            "/apis/kubevirt.io/v1/namespaces/d/virtualmachines?watch=true&fieldSelector=metadata.name%3Dvm1",
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("watch", "vm1"));
        assert!(i.is_collection);
        let i = info(
            "PUT",
            "/apis/kubevirt.io/v1/namespaces/d/virtualmachines/vm1/status",
        );
        assert_eq!(
            (i.verb.as_str(), i.subresource.as_str(), i.name.as_str()),
            ("update", "status", "vm1")
        );
        let i = info(
            "DELETE",
            "/apis/kubevirt.io/v1/namespaces/d/virtualmachines",
        );
        assert_eq!(i.verb, "deletecollection");
        let i = info(
            "GET",
            "/apis/subresources.kubevirt.io/v1/namespaces/d/virtualmachineinstances/vmi1/console",
        );
        assert_eq!(
            (i.verb.as_str(), i.subresource.as_str()),
            ("get", "console")
        );
        let i = info("GET", "/apis/kubevirt.io/v1");
        assert!(!i.is_resource);
        let i = info(
            "GET",
            "/apis/kubevirt.io/v1/watch/namespaces/d/virtualmachines",
        );
        assert_eq!(i.verb, "watch");
        let i = info("GET", "/apis/kubevirt.io/v1/virtualmachines");
        assert_eq!((i.verb.as_str(), i.namespace.as_str()), ("list", ""));
    }

    #[test]
    fn negotiation_prefers_table_then_json() {
        let a = parse_accept(Some(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        ));
        assert_eq!(negotiate(&a, true), Ok(Output::Table { yaml: false }));
        let a = parse_accept(Some(
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
        ));
        assert_eq!(negotiate(&a, true), Ok(Output::Metadata { yaml: false }));
        assert_eq!(negotiate(&a, false), Ok(Output::Object { yaml: false }));
        let a = parse_accept(Some(
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        ));
        assert!(negotiate(&a, true).unwrap_err().contains("is a list"));
        assert_eq!(
            negotiate(
                &parse_accept(Some("application/vnd.kubernetes.protobuf")),
                false
            )
            .unwrap_err()
            .split(':')
            .next(),
            Some("only the following media types are accepted")
        );
        assert_eq!(
            negotiate(&parse_accept(None), false),
            Ok(Output::Object { yaml: false })
        );
        assert_eq!(
            negotiate(&parse_accept(Some("application/yaml")), false),
            Ok(Output::Object { yaml: true })
        );
    }

    #[test]
    fn ages_match_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(185), "3m5s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(4 * 3600 + 60), "4h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(400 * 86400), "400d");
    }
}
