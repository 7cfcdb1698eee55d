//! `virt-importer clone` as the clone worker pod runs it: a claim's `disk.img` (sparse, with
//! a marker) copied into another claim's directory, the termination message and exit code
//! the controller reads; a source too large for the target fails typed and leaves nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Output};

const MARKER: &[u8] = b"kubevirt-rs-cloned-42";

fn run(source: &Path, target: &Path, size: &str) -> (Output, serde_json::Value) {
    let log = target.join(".termination-log");
    let out = Command::new(env!("CARGO_BIN_EXE_virt-importer"))
        .arg("clone")
        .args(["--source".as_ref(), source.as_os_str()])
        .args(["--target".as_ref(), target.as_os_str()])
        .args(["--size", size])
        .args(["--termination-log".as_ref(), log.as_os_str()])
        .output()
        .unwrap();
    let msg = serde_json::from_slice(&std::fs::read(&log).unwrap()).unwrap();
    (out, msg)
}

#[test]
fn the_binary_clones_a_claims_disk_and_reports_it() {
    let source = tempfile::tempdir().unwrap();
    let disk = std::fs::File::create(source.path().join("disk.img")).unwrap();
    disk.set_len(32 << 20).unwrap();
    disk.write_all_at(MARKER, 1 << 20).unwrap();
    drop(disk);

    let target = tempfile::tempdir().unwrap();
    let (out, msg) = run(source.path(), target.path(), "48Mi");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(msg["reason"], "Completed", "{msg}");
    assert!(
        msg["message"].as_str().unwrap().starts_with("cloned "),
        "{msg}"
    );
    let cloned = target.path().join("disk.img");
    let meta = std::fs::metadata(&cloned).unwrap();
    assert_eq!(meta.len(), 48 << 20);
    assert!(
        meta.blocks() * 512 <= 64 << 10,
        "sparse: {} blocks",
        meta.blocks()
    );
    let back = std::fs::read(&cloned).unwrap();
    assert_eq!(&back[1 << 20..(1 << 20) + MARKER.len()], MARKER);
    assert_eq!(back.iter().filter(|&&b| b != 0).count(), MARKER.len());

    let small = tempfile::tempdir().unwrap();
    let (out, msg) = run(source.path(), small.path(), "16Mi");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(msg["reason"], "ImageTooLarge", "{msg}");
    assert!(!small.path().join("disk.img").exists());
    assert!(!small.path().join("disk.img.importing").exists());
}
