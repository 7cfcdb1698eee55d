//! The test guest's disk benchmark (`cargo xtask bench storage`): busybox has no random
//! I/O tool, and a shell loop of `dd` would measure process start-up under TCG, not the
//! disk. Built by build.rs with the host's rustc, std only, and copied into the guest.
//!
//! `disk-bench DEVICE MODE BLOCK_BYTES SECONDS SPAN_MIB` runs MODE (`seqread`,
//! `seqwrite`, `randread`, `randwrite`) with O_DIRECT (no guest page cache) over the first
//! SPAN_MIB of DEVICE for SECONDS, and prints one line:
//! `disk-bench MODE bs=BLOCK_BYTES ops=N MiBps=X iops=Y`.

use std::alloc::{Layout, alloc_zeroed};
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

const O_DIRECT: i32 = 0o40000;
const ALIGN: usize = 4096;

fn fail(msg: &str) -> ! {
    eprintln!("disk-bench: {msg}");
    std::process::exit(2);
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 6 {
        fail("usage: disk-bench DEVICE seqread|seqwrite|randread|randwrite BLOCK_BYTES SECONDS SPAN_MIB");
    }
    let (dev, mode) = (&a[1], a[2].as_str());
    let num = |s: &str| s.parse::<u64>().unwrap_or_else(|_| fail(&format!("not a number: {s}")));
    let bs = num(&a[3]) as usize;
    let seconds = num(&a[4]);
    let span = num(&a[5]) << 20;
    if bs == 0 || bs % ALIGN != 0 || span < bs as u64 {
        fail("BLOCK_BYTES must be a multiple of 4096 and at most SPAN_MIB");
    }
    let write = mode.ends_with("write");
    let random = mode.starts_with("rand");
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(O_DIRECT)
        .open(dev)
        .unwrap_or_else(|e| fail(&format!("{dev}: {e}")));
    let layout = Layout::from_size_align(bs, ALIGN).unwrap_or_else(|e| fail(&e.to_string()));
    // SAFETY: the layout has a non-zero size; the buffer lives until the process ends.
    let buf = unsafe { std::slice::from_raw_parts_mut(alloc_zeroed(layout), bs) };
    buf.fill(0x5a);
    let blocks = span / bs as u64;
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = 0u64;
    let (mut ops, start) = (0u64, Instant::now());
    let limit = Duration::from_secs(seconds);
    while start.elapsed() < limit {
        let block = if random {
            // xorshift64: cheap, and the same sequence on every run.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % blocks
        } else {
            let b = next;
            next = (next + 1) % blocks;
            b
        };
        let off = block * bs as u64;
        let r = if write {
            f.write_all_at(buf, off)
        } else {
            f.read_exact_at(buf, off)
        };
        if let Err(e) = r {
            fail(&format!("{mode} at {off}: {e}"));
        }
        ops += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "disk-bench {mode} bs={bs} ops={ops} MiBps={:.2} iops={:.1}",
        ops as f64 * bs as f64 / secs / (1 << 20) as f64,
        ops as f64 / secs
    );
}
