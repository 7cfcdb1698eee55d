//! What the first bytes of a download are: a compression, a disk image format, or something
//! that is not a disk image at all (an HTML error page served with 200, CDI#1502).

/// How many leading bytes [`sniff`] wants to see: enough for an ISO 9660 volume descriptor
/// (at 32 KiB + 1). A shorter input is sniffed as it is (a tiny image).
pub const SNIFF_LEN: usize = 64 * 1024;

/// The result of [`sniff`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Gzip,
    Xz,
    Qcow2,
    Vmdk,
    /// Microsoft VHD (qemu's `vpc`), dynamic: its footer copy at offset 0. A fixed VHD has its
    /// footer only at the end and is raw data followed by 512 bytes, as qemu sees it too.
    Vhd,
    Vhdx,
    Vdi,
    /// ISO 9660: copied as raw.
    Iso,
    /// Text (HTML, JSON, an error message): never a disk.
    NotADiskImage(TextKind),
    Raw,
}

/// What kind of text [`Format::NotADiskImage`] saw, for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    Html,
    Text,
    Empty,
}

impl Format {
    /// The name `qemu-img` uses for it (`-f`, `info`'s `format`); None for what is copied
    /// as raw bytes or never written.
    pub fn qemu_name(self) -> Option<&'static str> {
        match self {
            Format::Qcow2 => Some("qcow2"),
            Format::Vmdk => Some("vmdk"),
            Format::Vhd => Some("vpc"),
            Format::Vhdx => Some("vhdx"),
            Format::Vdi => Some("vdi"),
            Format::Gzip | Format::Xz | Format::Iso | Format::Raw | Format::NotADiskImage(_) => {
                None
            }
        }
    }

    /// A format qemu-img has to convert (spooled to scratch first: it cannot read a pipe).
    pub fn needs_conversion(self) -> bool {
        self.qemu_name().is_some()
    }

    /// For logs and messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Gzip => "gzip",
            Format::Xz => "xz",
            Format::Qcow2 => "qcow2",
            Format::Vmdk => "vmdk",
            Format::Vhd => "vhd",
            Format::Vhdx => "vhdx",
            Format::Vdi => "vdi",
            Format::Iso => "iso",
            Format::NotADiskImage(TextKind::Html) => "html",
            Format::NotADiskImage(TextKind::Text) => "text",
            Format::NotADiskImage(TextKind::Empty) => "empty",
            Format::Raw => "raw",
        }
    }
}

/// Sniffs the leading bytes of a stream (give it [`SNIFF_LEN`] bytes, or all there are).
pub fn sniff(head: &[u8]) -> Format {
    if head.is_empty() {
        return Format::NotADiskImage(TextKind::Empty);
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        return Format::Gzip;
    }
    if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        return Format::Xz;
    }
    if head.starts_with(b"QFI\xfb") {
        return Format::Qcow2;
    }
    // Sparse extent ("KDMV"), ESX COW ("COWD"), or a descriptor file.
    if head.starts_with(b"KDMV")
        || head.starts_with(b"COWD")
        || head.starts_with(b"# Disk DescriptorFile")
    {
        return Format::Vmdk;
    }
    if head.starts_with(b"vhdxfile") {
        return Format::Vhdx;
    }
    if head.starts_with(b"conectix") {
        return Format::Vhd;
    }
    // VDI: a text banner ("<<< Oracle VM VirtualBox Disk Image >>>") then the signature at 0x40.
    if head.get(0x40..0x44) == Some(&[0x7f, 0x10, 0xda, 0xbe]) {
        return Format::Vdi;
    }
    if head.get(0x8001..0x8006) == Some(b"CD001") {
        return Format::Iso;
    }
    if let Some(kind) = text_kind(head) {
        return Format::NotADiskImage(kind);
    }
    Format::Raw
}

/// Whether `head` is text: no NUL and no control bytes but whitespace, valid UTF-8 (a
/// character cut at the end of the window allowed). Disk images start with binary (a boot
/// sector, zeroes, a header): 64 KiB without a single zero byte is no disk.
fn text_kind(head: &[u8]) -> Option<TextKind> {
    let utf8 = match std::str::from_utf8(head) {
        Ok(s) => s,
        // A character cut by the window's end (at most 3 bytes of it).
        Err(e) if e.error_len().is_none() && head.len() - e.valid_up_to() < 4 => {
            std::str::from_utf8(&head[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    let control = |c: char| c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\x0c');
    if utf8.chars().any(control) {
        return None;
    }
    let trimmed = utf8.trim_start_matches('\u{feff}').trim_start();
    let start: String = trimmed
        .chars()
        .take(16)
        .collect::<String>()
        .to_ascii_lowercase();
    let html = ["<!doctype html", "<html", "<head", "<body", "<?xml", "<!--"];
    if html.iter().any(|h| start.starts_with(h)) {
        Some(TextKind::Html)
    } else {
        Some(TextKind::Text)
    }
}

/// The virtual size a qcow2 or sparse vmdk header states, when `head` holds the header: an
/// oversized image is refused before its download (qemu-img info has the last word).
pub fn header_virtual_size(format: Format, head: &[u8]) -> Option<u64> {
    match format {
        // QCowHeader: size at 24, big endian.
        Format::Qcow2 => Some(u64::from_be_bytes(head.get(24..32)?.try_into().ok()?)),
        // SparseExtentHeader: capacity in 512-byte sectors at 12, little endian.
        Format::Vmdk if head.starts_with(b"KDMV") => {
            u64::from_le_bytes(head.get(12..20)?.try_into().ok()?).checked_mul(512)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: usize, bytes: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; (offset + bytes.len()).max(512)];
        v[offset..offset + bytes.len()].copy_from_slice(bytes);
        v
    }

    #[test]
    fn compressions() {
        assert_eq!(sniff(&[0x1f, 0x8b, 8, 0, 0, 0]), Format::Gzip);
        assert_eq!(sniff(b"\xfd7zXZ\x00\x00\x04"), Format::Xz);
        // Too short for xz's magic: not xz.
        assert_ne!(sniff(b"\xfd7zX"), Format::Xz);
    }

    #[test]
    fn image_formats() {
        assert_eq!(sniff(&at(0, b"QFI\xfb\0\0\0\x03")), Format::Qcow2);
        assert_eq!(sniff(&at(0, b"KDMV\x01\0\0\0")), Format::Vmdk);
        assert_eq!(sniff(b"# Disk DescriptorFile\nversion=1\n"), Format::Vmdk);
        assert_eq!(sniff(&at(0, b"conectix")), Format::Vhd);
        assert_eq!(sniff(&at(0, b"vhdxfile")), Format::Vhdx);
        let mut vdi = at(0, b"<<< Oracle VM VirtualBox Disk Image >>>\n");
        vdi.resize(0x100, 0);
        vdi[0x40..0x44].copy_from_slice(&[0x7f, 0x10, 0xda, 0xbe]);
        assert_eq!(sniff(&vdi), Format::Vdi);
        assert_eq!(sniff(&at(0x8001, b"CD001")), Format::Iso);
    }

    #[test]
    fn raw_is_the_rest() {
        assert_eq!(sniff(&[0u8; SNIFF_LEN]), Format::Raw);
        let mut mbr = vec![0u8; 512];
        mbr[0] = 0xeb;
        mbr[510] = 0x55;
        mbr[511] = 0xaa;
        assert_eq!(sniff(&mbr), Format::Raw);
        // Random-looking binary with a control byte.
        assert_eq!(sniff(b"abc\x01def"), Format::Raw);
        // Invalid UTF-8 in the middle: binary.
        assert_eq!(sniff(b"abc\xff\xfedef"), Format::Raw);
    }

    #[test]
    fn text_is_not_a_disk() {
        assert_eq!(
            sniff(b"<!DOCTYPE html>\n<html><body>Not here</body></html>"),
            Format::NotADiskImage(TextKind::Html)
        );
        assert_eq!(
            sniff(b"\xef\xbb\xbf  \n<HTML><head>"),
            Format::NotADiskImage(TextKind::Html)
        );
        assert_eq!(
            sniff(b"{\"error\": \"forbidden\"}\n"),
            Format::NotADiskImage(TextKind::Text)
        );
        assert_eq!(sniff(b""), Format::NotADiskImage(TextKind::Empty));
        // UTF-8 text cut in the middle of a character by the window.
        let mut s = "é".repeat(10).into_bytes();
        s.pop();
        assert_eq!(sniff(&s), Format::NotADiskImage(TextKind::Text));
    }

    #[test]
    fn qemu_names() {
        assert_eq!(Format::Vhd.qemu_name(), Some("vpc"));
        assert!(Format::Vdi.needs_conversion());
        assert!(!Format::Iso.needs_conversion());
        assert!(!Format::Raw.needs_conversion());
    }

    #[test]
    fn header_sizes() {
        let mut q = at(0, b"QFI\xfb\0\0\0\x03");
        q[24..32].copy_from_slice(&(1u64 << 30).to_be_bytes());
        assert_eq!(header_virtual_size(Format::Qcow2, &q), Some(1 << 30));
        let mut v = at(0, b"KDMV\x01\0\0\0");
        v[12..20].copy_from_slice(&2048u64.to_le_bytes());
        assert_eq!(header_virtual_size(Format::Vmdk, &v), Some(1 << 20));
        assert_eq!(header_virtual_size(Format::Qcow2, b"QFI\xfb"), None);
        assert_eq!(header_virtual_size(Format::Raw, &q), None);
    }
}
