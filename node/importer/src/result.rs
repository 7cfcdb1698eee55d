//! The typed outcome of an import or a clone and the pod's termination message: one JSON line
//! `{"reason": "...", "message": "..."}` of at most 4 KiB (kubelet's limit), which
//! virt-controller copies into the DataVolume's `Running` condition.

use std::path::PathBuf;

use serde::Serialize;

/// Why an import or a clone failed. [`ImportError::reason`] is the machine-readable part.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{url} answered 404 Not Found")]
    HttpNotFound { url: String },
    #[error("{url} answered HTTP {status}")]
    HttpStatus { url: String, status: u16 },
    #[error("{url}: {detail}")]
    Connection { url: String, detail: String },
    #[error(
        "{algorithm} of the downloaded bytes is {actual}, but the DataVolume's checksum is {algorithm}:{expected}"
    )]
    Checksum {
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    #[error("{}", too_large_message(*.image, *.usable, *.at_least))]
    TooLarge {
        /// The image's (virtual) size, or the bytes seen so far when `at_least`.
        image: u64,
        usable: u64,
        at_least: bool,
    },
    #[error("the source is not a disk image: {detail}")]
    NotADiskImage { detail: String },
    #[error("{detail}")]
    BackingFile { detail: String },
    #[error("{detail}")]
    Conversion { detail: String },
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "a {format} image has to be converted by qemu-img, which needs a scratch directory (--scratch) for a block-device target"
    )]
    ScratchSpaceRequired { format: &'static str },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the clone's source {}: {detail}", path.display())]
    SourceNotFound { path: PathBuf, detail: String },
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ImportError {
    /// The `reason` of the termination message (and of the DataVolume's condition).
    pub fn reason(&self) -> &'static str {
        match self {
            ImportError::HttpNotFound { .. } => "HTTPNotFound",
            ImportError::HttpStatus { .. } => "HTTPError",
            ImportError::Connection { .. } => "ConnectionFailed",
            ImportError::Checksum { .. } => "ChecksumError",
            ImportError::TooLarge { .. } => "ImageTooLarge",
            ImportError::NotADiskImage { .. } => "NotADiskImage",
            ImportError::BackingFile { .. } => "BackingFile",
            ImportError::Conversion { .. } => "ConversionFailed",
            ImportError::Write { .. } => "WriteFailed",
            ImportError::ScratchSpaceRequired { .. } => "ScratchSpaceRequired",
            ImportError::InvalidArgument(_) => "InvalidArgument",
            ImportError::SourceNotFound { .. } => "SourceNotFound",
            ImportError::Read { .. } => "ReadFailed",
        }
    }

    pub fn write(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ImportError {
        let path = path.into();
        move |source| ImportError::Write { path, source }
    }
}

/// Reason of a successful import.
pub const COMPLETED: &str = "Completed";

fn too_large_message(image: u64, usable: u64, at_least: bool) -> String {
    let what = if at_least {
        "the image has more than"
    } else {
        "the image's virtual size is"
    };
    format!(
        "{what} {image} bytes ({}), larger than the target's usable {usable} bytes ({}): request a volume of at least {}",
        human(image),
        human(usable),
        quantity_at_least(image)
    )
}

/// A size for people: "64.0 MiB".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// The smallest Kubernetes quantity in whole Mi (Gi when exact) that holds `bytes`: what to
/// put in `storage:`.
pub fn quantity_at_least(bytes: u64) -> String {
    const MI: u64 = 1 << 20;
    let mib = bytes.div_ceil(MI);
    if mib > 0 && mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// kubelet keeps at most 4096 bytes of a termination message.
pub const TERMINATION_MESSAGE_MAX: usize = 4096;

#[derive(Serialize)]
struct Message<'a> {
    reason: &'a str,
    message: &'a str,
}

/// The termination message: one JSON line of at most [`TERMINATION_MESSAGE_MAX`] bytes, the
/// message cut (on a character boundary, marked with "…") when it would not fit.
pub fn termination_message(reason: &str, message: &str) -> String {
    let render = |message: &str| {
        let mut s = serde_json::to_string(&Message { reason, message })
            .unwrap_or_else(|_| format!("{{\"reason\":\"{reason}\"}}"));
        s.push('\n');
        s
    };
    let out = render(message);
    if out.len() <= TERMINATION_MESSAGE_MAX {
        return out;
    }
    // The longest prefix that fits (escaping makes the JSON longer than the text, by how
    // much depends on the text): a binary search over its length.
    let (mut fits, mut too_long) = (0, message.len());
    while too_long - fits > 1 {
        let mid = (fits + too_long) / 2;
        let mut cut = mid;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        if render(&format!("{}…", &message[..cut])).len() <= TERMINATION_MESSAGE_MAX {
            fits = mid;
        } else {
            too_long = mid;
        }
    }
    while !message.is_char_boundary(fits) {
        fits -= 1;
    }
    render(&format!("{}…", &message[..fits]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons() {
        let e = ImportError::HttpNotFound {
            url: "http://x/y".into(),
        };
        assert_eq!(e.reason(), "HTTPNotFound");
        assert_eq!(e.to_string(), "http://x/y answered 404 Not Found");
        let e = ImportError::Checksum {
            algorithm: "sha256",
            expected: "aa".into(),
            actual: "bb".into(),
        };
        assert_eq!(e.reason(), "ChecksumError");
        let m = e.to_string();
        assert!(m.contains("aa") && m.contains("bb"), "{m}");
    }

    #[test]
    fn too_large_names_both_sizes_and_what_to_ask() {
        let e = ImportError::TooLarge {
            image: 1 << 30,
            usable: 64 << 20,
            at_least: false,
        };
        assert_eq!(
            e.to_string(),
            "the image's virtual size is 1073741824 bytes (1.0 GiB), larger than the target's usable \
             67108864 bytes (64.0 MiB): request a volume of at least 1Gi"
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity_at_least(1), "1Mi");
        assert_eq!(quantity_at_least(1 << 20), "1Mi");
        assert_eq!(quantity_at_least((1 << 20) + 1), "2Mi");
        assert_eq!(quantity_at_least(1 << 30), "1Gi");
        assert_eq!(quantity_at_least((1 << 30) + 1), "1025Mi");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 19), "1.5 MiB");
    }

    #[test]
    fn termination_message_is_one_bounded_json_line() {
        let m = termination_message("Completed", "ok");
        assert_eq!(m, "{\"reason\":\"Completed\",\"message\":\"ok\"}\n");
        // Long, with characters JSON escapes and multi-byte ones.
        let long = "\"é\n".repeat(3000);
        let m = termination_message("ConversionFailed", &long);
        assert!(m.len() <= TERMINATION_MESSAGE_MAX, "{}", m.len());
        assert_eq!(m.matches('\n').count(), 1);
        let v: serde_json::Value = serde_json::from_str(&m).unwrap();
        assert_eq!(v["reason"], "ConversionFailed");
        let msg = v["message"].as_str().unwrap();
        assert!(msg.ends_with('…') && msg.len() > 1000, "{}", msg.len());
    }
}
