//! `virt-importer import`: one HTTP(S) source into a claim.
//!
//! The body streams through, in bounded memory: checksum over the received bytes → sniff →
//! gzip/xz decompressed in-stream → sniff of what is inside → raw written straight into the
//! target (sparse), or another format spooled to scratch and converted by qemu-img.

use std::io::Write;
use std::path::{Path, PathBuf};

use reqwest::header::HeaderMap;

use crate::checksum::{Checksum, Hasher};
use crate::convert;
use crate::http;
use crate::progress::Progress;
use crate::result::{ImportError, human};
use crate::sniff::{Format, SNIFF_LEN, TextKind, header_virtual_size, sniff};
use crate::target::{SparseWriter, Target};

/// What to import, from the command line.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub url: String,
    /// A directory (Filesystem claim: `disk.img` in it) or a block device.
    pub target: PathBuf,
    /// Usable bytes of the target: the size of `disk.img` (required for a directory).
    pub size: Option<u64>,
    pub checksum: Option<Checksum>,
    /// PEM files of CAs trusted besides the built-in roots.
    pub cert_dir: Option<PathBuf>,
    /// `accessKeyId` and `secretKey`: basic auth.
    pub secret_dir: Option<PathBuf>,
    /// `Name: value` each.
    pub extra_headers: Vec<String>,
    /// Files of `Name: value` each (Secrets of `secretExtraHeaders`).
    pub extra_header_dir: Option<PathBuf>,
    /// Where formats qemu-img converts are spooled; default: the Filesystem target's directory.
    pub scratch: Option<PathBuf>,
    pub progress_file: Option<PathBuf>,
    pub qemu_img: PathBuf,
}

/// A completed import.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub url: String,
    pub written: PathBuf,
    pub format: Format,
    pub compression: Option<Format>,
    pub received: u64,
    /// The image's (virtual) size.
    pub image_size: u64,
    pub target_size: u64,
    pub checksum: Option<String>,
}

impl Outcome {
    pub fn message(&self) -> String {
        let compressed = self
            .compression
            .map(|c| format!(", {} compressed", c.name()))
            .unwrap_or_default();
        let checksum = self
            .checksum
            .as_ref()
            .map(|c| format!(", checksum {c} verified"))
            .unwrap_or_default();
        format!(
            "imported {} ({}{compressed}, {} bytes received{checksum}) into {}: image {} of {}",
            self.url,
            self.format.name(),
            self.received,
            self.written.display(),
            human(self.image_size),
            human(self.target_size)
        )
    }
}

/// Prefix of scratch spool files; leftovers of killed attempts are removed at start.
pub const SPOOL_PREFIX: &str = ".virt-importer-spool-";

/// Runs one import. On failure nothing is left in a Filesystem target but what was there
/// before (a previous `disk.img` stays until a new one replaces it).
pub async fn import(cfg: &Config, progress: &mut Progress) -> Result<Outcome, ImportError> {
    let (target, scratch) = prepare(&cfg.target, cfg.size, cfg.scratch.as_deref())?;
    let result = run(cfg, &target, scratch.as_deref(), progress).await;
    if result.is_err() {
        target.abandon();
    }
    progress.finish(result.is_ok());
    result
}

/// Resolves the target and the scratch directory and removes what killed attempts left.
pub fn prepare(
    target: &Path,
    size: Option<u64>,
    scratch: Option<&Path>,
) -> Result<(Target, Option<PathBuf>), ImportError> {
    let target = Target::resolve(target, size)?;
    target.clean_leftovers()?;
    let scratch = match (scratch, &target) {
        (Some(s), _) => Some(s.to_path_buf()),
        (None, Target::Filesystem { dir, .. }) => Some(dir.clone()),
        (None, Target::Block { .. }) => None,
    };
    if let Some(s) = &scratch {
        clean_spools(s);
    }
    Ok((target, scratch))
}

fn clean_spools(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(SPOOL_PREFIX) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn headers(cfg: &Config) -> Result<HeaderMap, ImportError> {
    let mut lines: Vec<String> = cfg.extra_headers.clone();
    if let Some(dir) = &cfg.extra_header_dir {
        for f in http::mounted_files(dir)? {
            let s = std::fs::read_to_string(&f).map_err(|e| {
                ImportError::InvalidArgument(format!("reading {}: {e}", f.display()))
            })?;
            lines.extend(
                s.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(str::to_string),
            );
        }
    }
    let mut map = HeaderMap::new();
    for l in &lines {
        let (n, v) = http::parse_header(l).map_err(ImportError::InvalidArgument)?;
        map.append(n, v);
    }
    Ok(map)
}

async fn run(
    cfg: &Config,
    target: &Target,
    scratch: Option<&Path>,
    progress: &mut Progress,
) -> Result<Outcome, ImportError> {
    let url = reqwest::Url::parse(&cfg.url)
        .map_err(|e| ImportError::InvalidArgument(format!("URL {:?}: {e}", cfg.url)))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ImportError::InvalidArgument(format!(
            "URL {}: only http and https sources are imported",
            http::redact(&url)
        )));
    }
    let shown = http::redact(&url);
    let client = http::client(&http::ClientOptions {
        cert_dir: cfg.cert_dir.as_deref(),
        headers: headers(cfg)?,
    })?;
    let mut req = client.get(url.clone());
    if let Some(dir) = &cfg.secret_dir {
        let (user, password) = http::basic_auth(dir)?;
        req = req.basic_auth(user, Some(password));
    }
    tracing::info!(url = %shown, target = %cfg.target.display(), size = target.size(), "importing");
    let resp = req
        .send()
        .await
        .map_err(|e| http::connection_error(&shown, &e))?;
    http::check_status(&shown, resp.status())?;
    let source = Source {
        name: shown.clone(),
        total: resp.content_length(),
        checksum: cfg.checksum.as_ref(),
        qemu_img: &cfg.qemu_img,
    };
    // Boxed: the stream's type is hidden, and ingest needs it Unpin.
    let chunks = Box::pin(resp.bytes_stream());
    ingest(&source, target, scratch, chunks, progress, |received, e| {
        let of = source.total.map(|t| format!(" of {t}")).unwrap_or_default();
        let mut err = http::connection_error(&shown, &e);
        if let ImportError::Connection { detail, .. } = &mut err {
            *detail = format!("the transfer broke after {received}{of} bytes: {detail}");
        }
        err
    })
    .await
}

/// Where a stream of image bytes comes from, for [`ingest`].
#[derive(Debug)]
pub struct Source<'a> {
    /// How the source is named in messages (a URL with its password redacted, "the upload").
    pub name: String,
    /// Its length, when announced (Content-Length).
    pub total: Option<u64>,
    pub checksum: Option<&'a Checksum>,
    pub qemu_img: &'a Path,
}

/// Writes a stream of image bytes into `target`: shared by `import` (an HTTP download) and
/// `upload-server` (a request body), so both sniff, unpack, convert and commit the same
/// way. The target gets `disk.img` only when everything arrived and converted; the caller
/// abandons the target on error.
pub async fn ingest<S, E>(
    source: &Source<'_>,
    target: &Target,
    scratch: Option<&Path>,
    mut chunks: S,
    progress: &mut Progress,
    broken: impl Fn(u64, E) -> ImportError,
) -> Result<Outcome, ImportError>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
{
    use futures::StreamExt;
    let total = source.total;
    progress.set_total(total);
    let mut hasher = source.checksum.map(|c| Hasher::new(c.algorithm));
    let mut pipe = Pipeline::new(target, scratch, total);
    let mut announced = false;
    let mut received = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| broken(received, e))?;
        received += chunk.len() as u64;
        if let Some(h) = &mut hasher {
            h.update(&chunk);
        }
        pipe.write(&chunk)?;
        if !announced && let Some(f) = pipe.format() {
            announced = true;
            progress.set_format(f.name(), f.needs_conversion());
        }
        progress.received(chunk.len() as u64);
    }
    let compression = pipe.compression();
    let sink = pipe.finish()?;
    if !announced {
        progress.set_format(sink.format().name(), sink.format().needs_conversion());
    }
    let checksum = match (source.checksum, hasher) {
        (Some(want), Some(h)) => {
            let got = h.finish();
            if got != want.hex {
                return Err(ImportError::Checksum {
                    algorithm: want.algorithm.name(),
                    expected: want.hex.clone(),
                    actual: got,
                });
            }
            Some(format!("{}:{got}", want.algorithm.name()))
        }
        _ => None,
    };
    let usable = target.size();
    let (format, image_size) = match sink {
        Sink::Raw { writer, format } => {
            if writer.over_limit() {
                return Err(ImportError::TooLarge {
                    image: writer.len(),
                    usable,
                    at_least: false,
                });
            }
            let len = writer.len();
            let file = writer.finish()?;
            target.commit(&file)?;
            (format, len)
        }
        Sink::Spool {
            writer,
            path,
            format,
        } => {
            // Trailing zero blocks were skipped: the spool gets its full length.
            let len = writer.len();
            writer
                .finish()?
                .set_len(len)
                .map_err(ImportError::write(&*path))?;
            let info = convert::info(source.qemu_img, &path).await?;
            convert::check_info(&info, format, &path, usable)?;
            let file = target.open()?;
            let dst = target.write_path();
            let how = convert::Destination {
                zeroed: target.sparse(),
                direct: convert::opens_direct(&dst),
            };
            progress.converting(0.0);
            convert::convert(source.qemu_img, &path, format, &dst, how, |f| {
                progress.converting(f)
            })
            .await?;
            // The spool goes before the commit: the scratch space is free as soon as possible.
            drop(path);
            target.commit(&file)?;
            (format, info.virtual_size)
        }
    };
    let written = match target {
        Target::Filesystem { dir, .. } => dir.join(crate::target::DISK_IMG),
        Target::Block { path, .. } => path.clone(),
    };
    Ok(Outcome {
        url: source.name.clone(),
        written,
        format,
        compression,
        received,
        image_size,
        target_size: usable,
        checksum,
    })
}

/// Where the (decompressed) data ended up.
#[derive(Debug)]
enum Sink {
    Raw {
        writer: SparseWriter,
        format: Format,
    },
    Spool {
        writer: SparseWriter,
        /// Deletes the spool when dropped.
        path: tempfile::TempPath,
        format: Format,
    },
}

impl Sink {
    fn format(&self) -> Format {
        match self {
            Sink::Raw { format, .. } | Sink::Spool { format, .. } => *format,
        }
    }
}

/// Gets the decompressed stream (or the plain one), sniffs it and sends it to its [`Sink`].
/// An `io::Write` so that the decompressors can write into it; its own errors are kept
/// typed in `error`.
#[derive(Debug)]
struct Decoded<'a> {
    target: &'a Target,
    scratch: Option<&'a Path>,
    /// The image's length when the stream is not compressed (Content-Length).
    known_len: Option<u64>,
    compressed: bool,
    head: Vec<u8>,
    sink: Option<Sink>,
    error: Option<ImportError>,
}

impl<'a> Decoded<'a> {
    fn new(
        target: &'a Target,
        scratch: Option<&'a Path>,
        known_len: Option<u64>,
        compressed: bool,
    ) -> Self {
        Decoded {
            target,
            scratch,
            known_len,
            compressed,
            head: Vec::new(),
            sink: None,
            error: None,
        }
    }

    fn accept(&mut self, mut data: &[u8]) -> Result<(), ImportError> {
        if self.sink.is_none() {
            let n = (SNIFF_LEN - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.head.len() < SNIFF_LEN {
                return Ok(());
            }
            self.decide()?;
        }
        match &mut self.sink {
            Some(Sink::Raw { writer, .. } | Sink::Spool { writer, .. }) => writer.write(data),
            None => Ok(()),
        }
    }

    /// Sniffs `head` and opens the sink it goes to.
    fn decide(&mut self) -> Result<(), ImportError> {
        let head = std::mem::take(&mut self.head);
        let format = sniff(&head);
        let usable = self.target.size();
        let writer = match format {
            Format::Gzip | Format::Xz => {
                return Err(ImportError::NotADiskImage {
                    detail: format!(
                        "{} data inside a compressed stream: only one level of gzip or xz is unpacked",
                        format.name()
                    ),
                });
            }
            Format::NotADiskImage(kind) => {
                return Err(ImportError::NotADiskImage {
                    detail: text_detail(kind, &head),
                });
            }
            Format::Raw | Format::Iso => {
                if let Some(len) = self.known_len.filter(|&l| l > usable) {
                    return Err(ImportError::TooLarge {
                        image: len,
                        usable,
                        at_least: false,
                    });
                }
                let file = self.target.open()?;
                let w = SparseWriter::new(
                    file,
                    self.target.write_path(),
                    self.target.sparse(),
                    Some(usable),
                );
                self.sink = Some(Sink::Raw { writer: w, format });
                match &mut self.sink {
                    Some(Sink::Raw { writer, .. }) => writer,
                    _ => return Ok(()),
                }
            }
            _ => {
                if let Some(size) = header_virtual_size(format, &head).filter(|&s| s > usable) {
                    return Err(ImportError::TooLarge {
                        image: size,
                        usable,
                        at_least: false,
                    });
                }
                let dir = self.scratch.ok_or(ImportError::ScratchSpaceRequired {
                    format: format.name(),
                })?;
                let tmp = tempfile::Builder::new()
                    .prefix(SPOOL_PREFIX)
                    .tempfile_in(dir)
                    .map_err(ImportError::write(dir))?;
                let (file, path) = tmp.into_parts();
                let w = SparseWriter::new(file, path.to_path_buf(), true, None);
                self.sink = Some(Sink::Spool {
                    writer: w,
                    path,
                    format,
                });
                match &mut self.sink {
                    Some(Sink::Spool { writer, .. }) => writer,
                    _ => return Ok(()),
                }
            }
        };
        tracing::info!(
            format = format.name(),
            compressed = self.compressed,
            "sniffed the source"
        );
        writer.write(&head)
    }

    fn finish(mut self) -> Result<Sink, ImportError> {
        if self.sink.is_none() {
            self.decide()?;
        }
        self.sink.ok_or_else(|| ImportError::NotADiskImage {
            detail: "no data".into(),
        })
    }

    fn format(&self) -> Option<Format> {
        self.sink.as_ref().map(Sink::format)
    }
}

impl Write for Decoded<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.accept(buf) {
            Ok(()) => Ok(buf.len()),
            Err(e) => {
                let text = e.to_string();
                self.error = Some(e);
                Err(std::io::Error::other(text))
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the server sent instead of a disk, for the message: the start of the text, on one line.
fn text_detail(kind: TextKind, head: &[u8]) -> String {
    let text = String::from_utf8_lossy(head);
    let excerpt: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(160)
        .collect();
    match kind {
        TextKind::Empty => "the server sent no data".into(),
        TextKind::Html => format!(
            "the server sent an HTML page (an error or login page?) instead of an image: {excerpt:?}"
        ),
        TextKind::Text => format!("the server sent text instead of an image: {excerpt:?}"),
    }
}

/// The stream as it arrives: the first bytes say whether it is gzip or xz.
enum Stage<'a> {
    Start(Vec<u8>, Decoded<'a>),
    Gzip(flate2::write::MultiGzDecoder<Decoded<'a>>),
    Xz(xz2::write::XzDecoder<Decoded<'a>>),
    Plain(Decoded<'a>),
    /// Only while switching.
    Empty,
}

impl std::fmt::Debug for Stage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Start(..) => "Start",
            Stage::Gzip(_) => "Gzip",
            Stage::Xz(_) => "Xz",
            Stage::Plain(_) => "Plain",
            Stage::Empty => "Empty",
        })
    }
}

/// The longest magic of a compression.
const COMPRESSION_MAGIC: usize = 6;

#[derive(Debug)]
struct Pipeline<'a> {
    stage: Stage<'a>,
    total: Option<u64>,
}

impl<'a> Pipeline<'a> {
    fn new(target: &'a Target, scratch: Option<&'a Path>, total: Option<u64>) -> Self {
        Pipeline {
            stage: Stage::Start(Vec::new(), Decoded::new(target, scratch, None, false)),
            total,
        }
    }

    fn write(&mut self, data: &[u8]) -> Result<(), ImportError> {
        if let Stage::Start(head, _) = &mut self.stage {
            head.extend_from_slice(data);
            if head.len() < COMPRESSION_MAGIC {
                return Ok(());
            }
            return self.start();
        }
        self.feed(data)
    }

    /// Chooses the decompressor from the first bytes and feeds them through.
    fn start(&mut self) -> Result<(), ImportError> {
        let Stage::Start(head, mut decoded) = std::mem::replace(&mut self.stage, Stage::Empty)
        else {
            return Ok(());
        };
        self.stage = match sniff(&head) {
            Format::Gzip => {
                decoded.compressed = true;
                Stage::Gzip(flate2::write::MultiGzDecoder::new(decoded))
            }
            Format::Xz => {
                decoded.compressed = true;
                Stage::Xz(xz2::write::XzDecoder::new_multi_decoder(decoded))
            }
            _ => {
                decoded.known_len = self.total;
                Stage::Plain(decoded)
            }
        };
        self.feed(&head)
    }

    fn feed(&mut self, data: &[u8]) -> Result<(), ImportError> {
        match &mut self.stage {
            Stage::Gzip(d) => {
                let r = d.write_all(data);
                unpacked(r, d.get_mut(), "gzip")
            }
            Stage::Xz(d) => {
                let r = d.write_all(data);
                unpacked(r, d.get_mut(), "xz")
            }
            Stage::Plain(d) => d.accept(data),
            Stage::Start(..) | Stage::Empty => Ok(()),
        }
    }

    fn format(&self) -> Option<Format> {
        match &self.stage {
            Stage::Gzip(d) => d.get_ref().format(),
            Stage::Xz(d) => d.get_ref().format(),
            Stage::Plain(d) => d.format(),
            Stage::Start(..) | Stage::Empty => None,
        }
    }

    fn compression(&self) -> Option<Format> {
        match &self.stage {
            Stage::Gzip(_) => Some(Format::Gzip),
            Stage::Xz(_) => Some(Format::Xz),
            _ => None,
        }
    }

    fn finish(mut self) -> Result<Sink, ImportError> {
        if matches!(self.stage, Stage::Start(..)) {
            self.start()?;
        }
        let decoded = match self.stage {
            Stage::Gzip(d) => {
                // The decoder gives its writer back only when the stream ended well.
                let mut d = d;
                let r = d.try_finish();
                unpacked(r, d.get_mut(), "gzip")?;
                d.finish().map_err(|e| unpack_error("gzip", &e))?
            }
            Stage::Xz(mut d) => match d.finish() {
                Ok(decoded) => decoded,
                Err(e) => {
                    return Err(d
                        .get_mut()
                        .error
                        .take()
                        .unwrap_or_else(|| unpack_error("xz", &e)));
                }
            },
            Stage::Plain(d) => d,
            Stage::Start(..) | Stage::Empty => {
                return Err(ImportError::NotADiskImage {
                    detail: "no data".into(),
                });
            }
        };
        decoded.finish()
    }
}

/// The result of a decompressor's write: our own typed error if the sink failed, else a
/// corrupt stream.
fn unpacked(
    r: std::io::Result<()>,
    decoded: &mut Decoded<'_>,
    what: &str,
) -> Result<(), ImportError> {
    match r {
        Ok(()) => Ok(()),
        Err(e) => Err(decoded
            .error
            .take()
            .unwrap_or_else(|| unpack_error(what, &e))),
    }
}

fn unpack_error(what: &str, e: &std::io::Error) -> ImportError {
    ImportError::Conversion {
        detail: format!("the {what} stream is corrupt or truncated: {e}"),
    }
}
