//! The `kubevirt.io/kubevirt` Go module kubevirt-rs follows: the version `e2e/virtctl/go.mod`
//! pins (the one whose virtctl the e2e tests drive) and where that module's files are. Build
//! scripts take KubeVirt's data from it (the common-instancetypes bundles, the Prometheus
//! rules) and tests compare against it (the metric list), so that all of them follow one
//! version and none retypes upstream data.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Go module.
pub const MODULE: &str = "kubevirt.io/kubevirt";

/// Names a copy of the module to use instead of looking for it (an image build that fetched
/// it elsewhere).
pub const MODULE_DIR_ENV: &str = "KUBEVIRT_RS_KUBEVIRT_MODULE_DIR";

/// What went wrong finding the module or reading its data.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} requires no {MODULE}")]
    NotRequired(PathBuf),
    #[error(
        "{MODULE}@{0} is not in the Go module cache and Go is not installed to download it: \
         install Go (https://go.dev/dl/, to /usr/local/go) or set {MODULE_DIR_ENV} to a copy \
         of the module"
    )]
    NoGo(String),
    #[error("go mod download -json {MODULE}@{version} failed: {output}")]
    Download { version: String, output: String },
    #[error("{0}")]
    Parse(String),
}

/// `e2e/virtctl/go.mod` under the workspace root: the pin.
pub fn pinned_go_mod(workspace_root: &Path) -> PathBuf {
    workspace_root.join("e2e/virtctl/go.mod")
}

/// The version of [`MODULE`] that `go_mod` requires.
pub fn required_version(go_mod: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(go_mod).map_err(|source| Error::Read {
        path: go_mod.to_path_buf(),
        source,
    })?;
    text.lines()
        .map(|l| l.trim().trim_start_matches("require").trim())
        .find_map(|l| {
            let mut parts = l.split_whitespace();
            (parts.next() == Some(MODULE)).then(|| parts.next().map(str::to_string))?
        })
        .ok_or_else(|| Error::NotRequired(go_mod.to_path_buf()))
}

/// A `go` that runs: on PATH, else where Go's installer puts it.
pub fn go() -> Option<&'static str> {
    ["go", "/usr/local/go/bin/go"].into_iter().find(|g| {
        Command::new(g)
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The module's directory at `version`: [`MODULE_DIR_ENV`] if set, else Go's module cache
/// (`$GOMODCACHE`, `$GOPATH/pkg/mod`, `~/go/pkg/mod`) when it holds `needed` (a path inside
/// the module), else `go mod download -json` run in `pin_dir` (the directory of the pinning
/// go.mod), which fetches it from the Go module proxy and checks it against that go.sum.
pub fn module_dir(pin_dir: &Path, version: &str, needed: &str) -> Result<PathBuf, Error> {
    if let Ok(dir) = std::env::var(MODULE_DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let caches = [
        std::env::var("GOMODCACHE").ok().map(PathBuf::from),
        std::env::var("GOPATH")
            .ok()
            .map(|p| PathBuf::from(p).join("pkg/mod")),
        std::env::var("HOME")
            .ok()
            .map(|h| PathBuf::from(h).join("go/pkg/mod")),
    ];
    for cache in caches.into_iter().flatten() {
        let dir = cache.join(format!("{MODULE}@{version}"));
        if dir.join(needed).exists() {
            return Ok(dir);
        }
    }
    let go = go().ok_or_else(|| Error::NoGo(version.to_string()))?;
    let output = Command::new(go)
        .args(["mod", "download", "-json", &format!("{MODULE}@{version}")])
        .current_dir(pin_dir)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .map_err(|e| Error::Download {
            version: version.to_string(),
            output: e.to_string(),
        })?;
    let failed = |output: String| Error::Download {
        version: version.to_string(),
        output,
    };
    if !output.status.success() {
        return Err(failed(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| failed(format!("not JSON: {e}")))?;
    v["Dir"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| failed(format!("no Dir in {v}")))
}

/// The module's directory at the version `workspace_root`'s pin requires.
pub fn pinned_module_dir(workspace_root: &Path, needed: &str) -> Result<(String, PathBuf), Error> {
    let go_mod = pinned_go_mod(workspace_root);
    let version = required_version(&go_mod)?;
    let pin_dir = go_mod.parent().unwrap_or(workspace_root);
    let dir = module_dir(pin_dir, &version, needed)?;
    Ok((version, dir))
}

/// KubeVirt's metric list, `docs/observability/metrics.md` in the module.
pub const METRICS_MD: &str = "docs/observability/metrics.md";

/// One metric of [`METRICS_MD`]: its help text and type (`Counter`, `Gauge`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    pub help: String,
    pub kind: String,
}

/// Parses [`METRICS_MD`]: `### <name>`, then `<help> Type: <type>.` per metric.
pub fn parse_metrics_md(md: &str) -> Result<BTreeMap<String, Metric>, Error> {
    let mut out = BTreeMap::new();
    let mut name: Option<String> = None;
    for line in md.lines() {
        if let Some(n) = line.strip_prefix("### ") {
            name = Some(n.trim().to_string());
        } else if let Some(n) = name.take() {
            if line.trim().is_empty() {
                name = Some(n);
                continue;
            }
            let (help, kind) = line
                .rsplit_once(" Type: ")
                .ok_or_else(|| Error::Parse(format!("{n}: no type in {line:?}")))?;
            out.insert(
                n,
                Metric {
                    help: help.to_string(),
                    kind: kind.trim_end_matches('.').to_string(),
                },
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_required_version_is_read_from_either_require_form() {
        let dir = std::env::temp_dir().join(format!("upstream-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let single = dir.join("single.mod");
        std::fs::write(&single, "module x\n\nrequire kubevirt.io/kubevirt v1.6.0\n").unwrap();
        assert_eq!(required_version(&single).unwrap(), "v1.6.0");
        let block = dir.join("block.mod");
        std::fs::write(
            &block,
            "module x\nrequire (\n\tk8s.io/api v0.33.0\n\tkubevirt.io/kubevirt v1.6.1 // indirect\n)\n",
        )
        .unwrap();
        assert_eq!(required_version(&block).unwrap(), "v1.6.1");
        let none = dir.join("none.mod");
        std::fs::write(&none, "module x\n").unwrap();
        assert!(matches!(
            required_version(&none),
            Err(Error::NotRequired(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn metrics_md_entries_are_name_help_and_type() {
        let md = "# Metrics\n\n### kubevirt_vmi_info\n\nInformation about VMIs. Type: Gauge.\n\n\
                  ### kubevirt_vmi_vcpu_seconds_total\nTotal amount of time spent in each state by each vcpu. Type: Counter.\n";
        let m = parse_metrics_md(md).unwrap();
        assert_eq!(
            m["kubevirt_vmi_info"],
            Metric {
                help: "Information about VMIs.".into(),
                kind: "Gauge".into()
            }
        );
        assert_eq!(m["kubevirt_vmi_vcpu_seconds_total"].kind, "Counter");
        assert!(parse_metrics_md("### x\nno type here\n").is_err());
    }
}
