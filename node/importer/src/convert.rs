//! Formats qemu-img converts: `qemu-img info --output=json` first (the format must be the
//! sniffed one, no backing or external data file, the virtual size must fit), then
//! `qemu-img convert -p -O raw -S 4k` with its progress parsed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncReadExt;

use crate::result::ImportError;
use crate::sniff::Format;

/// What `qemu-img info` reports that the importer checks.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ImageInfo {
    pub format: String,
    pub virtual_size: u64,
    #[serde(default)]
    pub backing_filename: Option<String>,
    #[serde(default)]
    pub full_backing_filename: Option<String>,
    #[serde(default)]
    pub format_specific: Option<FormatSpecific>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FormatSpecific {
    #[serde(default)]
    pub data: FormatData,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FormatData {
    /// qcow2's external data file.
    #[serde(default)]
    pub data_file: Option<String>,
    /// vmdk's extents.
    #[serde(default)]
    pub extents: Vec<Extent>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Extent {
    pub filename: String,
}

pub fn parse_info(json: &[u8]) -> Result<ImageInfo, String> {
    serde_json::from_slice(json).map_err(|e| format!("qemu-img info's output: {e}"))
}

/// The checks on a downloaded image before it is converted. `file`: the spooled image, as
/// given to qemu-img (its vmdk extents must all be that file).
pub fn check_info(
    info: &ImageInfo,
    sniffed: Format,
    file: &Path,
    usable: u64,
) -> Result<(), ImportError> {
    let expected = sniffed.qemu_name().unwrap_or("raw");
    if info.format != expected {
        return Err(ImportError::NotADiskImage {
            detail: format!(
                "its first bytes look like {}, but qemu-img reads it as {}",
                sniffed.name(),
                info.format
            ),
        });
    }
    if let Some(b) = info
        .backing_filename
        .as_ref()
        .or(info.full_backing_filename.as_ref())
    {
        return Err(ImportError::BackingFile {
            detail: format!(
                "the {} image has a backing file ({b:?}): only self-contained images can be imported (qemu-img convert -O {} it into one first)",
                sniffed.name(),
                expected
            ),
        });
    }
    if let Some(data) = info.format_specific.as_ref().map(|f| &f.data) {
        if let Some(d) = &data.data_file {
            return Err(ImportError::BackingFile {
                detail: format!(
                    "the {} image keeps its data in an external file ({d:?}): only self-contained images can be imported",
                    sniffed.name()
                ),
            });
        }
        let own = file.to_string_lossy();
        if let Some(e) = data.extents.iter().find(|e| e.filename != own) {
            return Err(ImportError::BackingFile {
                detail: format!(
                    "the vmdk image refers to another extent file ({:?}): only single-file (monolithicSparse or streamOptimized) vmdk images can be imported",
                    e.filename
                ),
            });
        }
    }
    if info.virtual_size > usable {
        return Err(ImportError::TooLarge {
            image: info.virtual_size,
            usable,
            at_least: false,
        });
    }
    Ok(())
}

/// qemu-img reads the header of an untrusted image: bounded in time.
const INFO_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn info(qemu_img: &Path, file: &Path) -> Result<ImageInfo, ImportError> {
    let mut cmd = tokio::process::Command::new(qemu_img);
    // No `-f`: qemu-img probes, and the probe must agree with the sniff.
    cmd.args(["info", "--output=json"])
        .arg(file)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(INFO_TIMEOUT, cmd.output())
        .await
        .map_err(|_| ImportError::Conversion {
            detail: format!("qemu-img info did not finish within {INFO_TIMEOUT:?}"),
        })?
        .map_err(|e| ImportError::Conversion {
            detail: format!("running {}: {e}", qemu_img.display()),
        })?;
    if !out.status.success() {
        return Err(ImportError::Conversion {
            detail: format!(
                "qemu-img info failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    parse_info(&out.stdout).map_err(|detail| ImportError::Conversion { detail })
}

/// The last progress `qemu-img convert -p` printed in `out` ("    (37.42/100%)\r"), as a
/// fraction.
pub fn parse_progress(out: &str) -> Option<f64> {
    out.split(['\r', '\n']).rev().find_map(|line| {
        let inner = line.trim().strip_prefix('(')?.strip_suffix("/100%)")?;
        let v: f64 = inner.parse().ok()?;
        Some((v / 100.0).clamp(0.0, 1.0))
    })
}

/// How the destination is written.
#[derive(Debug, Clone, Copy)]
pub struct Destination {
    /// A file the importer just created, sized and all zero (`--target-is-zero`).
    pub zeroed: bool,
    /// Opens with O_DIRECT: qemu-img writes with `-t none`, no dirty page cache.
    pub direct: bool,
}

/// Whether `path` can be opened with O_DIRECT (not on tmpfs, for one).
pub fn opens_direct(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(path)
        .is_ok()
}

/// `qemu-img convert` of `src` (format `format`) into the existing `dst`, calling
/// `progress` with the fraction done.
pub async fn convert(
    qemu_img: &Path,
    src: &Path,
    format: Format,
    dst: &Path,
    how: Destination,
    mut progress: impl FnMut(f64),
) -> Result<(), ImportError> {
    let fmt = format.qemu_name().unwrap_or("raw");
    let mut cmd = tokio::process::Command::new(qemu_img);
    cmd.args(["convert", "-p", "-f", fmt, "-O", "raw", "-S", "4k", "-n"]);
    if how.zeroed {
        cmd.arg("--target-is-zero");
    }
    if how.direct {
        cmd.args(["-t", "none"]);
    }
    cmd.arg(src)
        .arg(dst)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    tracing::info!(?cmd, "converting");
    let mut child = cmd.spawn().map_err(|e| ImportError::Conversion {
        detail: format!("running {}: {e}", qemu_img.display()),
    })?;
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ImportError::Conversion {
            detail: "qemu-img's output pipes are missing".into(),
        });
    };
    // stderr kept whole up to 16 KiB, for the message.
    let errors = tokio::spawn(async move {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            if buf.len() < 16 << 10 {
                buf.extend_from_slice(&chunk[..n]);
            }
        }
        String::from_utf8_lossy(&buf).trim().to_string()
    });
    let mut chunk = [0u8; 512];
    while let Ok(n) = stdout.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        if let Some(f) = parse_progress(&String::from_utf8_lossy(&chunk[..n])) {
            progress(f);
        }
    }
    let status = child.wait().await.map_err(|e| ImportError::Conversion {
        detail: format!("waiting for qemu-img: {e}"),
    })?;
    let errors = errors.await.unwrap_or_default();
    if !status.success() {
        // qemu-img names the destination it could not write: a full volume is a write
        // failure, the rest is the image's.
        let no_space = errors.contains("No space left on device");
        let detail = format!("qemu-img convert -f {fmt} -O raw failed ({status}): {errors}");
        return Err(if no_space {
            ImportError::Write {
                path: dst.to_path_buf(),
                source: std::io::Error::other(detail),
            }
        } else {
            ImportError::Conversion { detail }
        });
    }
    progress(1.0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines() {
        assert_eq!(parse_progress("    (0.00/100%)\r"), Some(0.0));
        assert_eq!(
            parse_progress("    (1.01/100%)\r    (37.50/100%)\r"),
            Some(0.375)
        );
        // A line cut by the pipe's read: the last complete one counts.
        assert_eq!(parse_progress("    (12.00/100%)\r    (13."), Some(0.12));
        assert_eq!(parse_progress("    (100.00/100%)\n"), Some(1.0));
        assert_eq!(parse_progress("garbage"), None);
    }

    const QCOW2_INFO: &str = r#"{
        "children": [],
        "virtual-size": 8388608,
        "filename": "/s/img",
        "cluster-size": 65536,
        "format": "qcow2",
        "actual-size": 2101248,
        "format-specific": {"type": "qcow2", "data": {"compat": "1.1", "compression-type": "zlib",
            "lazy-refcounts": false, "refcount-bits": 16, "corrupt": false, "extended-l2": false}},
        "dirty-flag": false
    }"#;

    #[test]
    fn info_checks() {
        let p = Path::new("/s/img");
        let info = parse_info(QCOW2_INFO.as_bytes()).unwrap();
        assert_eq!(info.virtual_size, 8 << 20);
        check_info(&info, Format::Qcow2, p, 8 << 20).unwrap();
        let e = check_info(&info, Format::Qcow2, p, 4 << 20).unwrap_err();
        assert_eq!(e.reason(), "ImageTooLarge");
        let e = check_info(&info, Format::Vmdk, p, 8 << 20).unwrap_err();
        assert_eq!(e.reason(), "NotADiskImage");

        let mut backed = info.clone();
        backed.backing_filename = Some("/etc/passwd".into());
        let e = check_info(&backed, Format::Qcow2, p, 8 << 20).unwrap_err();
        assert_eq!(e.reason(), "BackingFile");
        assert!(e.to_string().contains("/etc/passwd"));

        let mut data_file = info.clone();
        data_file.format_specific = Some(FormatSpecific {
            data: FormatData {
                data_file: Some("/dev/sda".into()),
                extents: vec![],
            },
        });
        let e = check_info(&data_file, Format::Qcow2, p, 8 << 20).unwrap_err();
        assert_eq!(e.reason(), "BackingFile");
    }

    #[test]
    fn vmdk_extents_must_be_the_file_itself() {
        let json = r#"{"virtual-size": 1048576, "format": "vmdk", "format-specific":
            {"type": "vmdk", "data": {"cid": 1, "create-type": "monolithicFlat",
             "extents": [{"filename": "/var/run/secret", "format": "FLAT", "virtual-size": 1048576}]}}}"#;
        let info = parse_info(json.as_bytes()).unwrap();
        let e = check_info(&info, Format::Vmdk, Path::new("/s/img"), 1 << 20).unwrap_err();
        assert_eq!(e.reason(), "BackingFile");
        let own = json.replace("/var/run/secret", "/s/img");
        let info = parse_info(own.as_bytes()).unwrap();
        check_info(&info, Format::Vmdk, Path::new("/s/img"), 1 << 20).unwrap();
    }
}
