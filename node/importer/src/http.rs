//! The HTTP(S) side: the client (rustls, webpki roots plus the CA files of `--cert-dir`,
//! redirects followed, no proxy from the environment), basic auth from `--secret-dir`,
//! extra headers, and errors that name the URL.

use std::path::Path;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::result::ImportError;

/// Parses one extra header, `Name: value` (CDI's `extraHeaders` form).
pub fn parse_header(line: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| format!("extra header {line:?}: expected `Name: value`"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
        format!(
            "extra header {line:?}: {:?} is not a header name",
            name.trim()
        )
    })?;
    let value = HeaderValue::from_str(value.trim()).map_err(|_| {
        format!("extra header {name}: the value has characters a header cannot carry")
    })?;
    Ok((name, value))
}

/// The files of a directory mounted from a Secret or ConfigMap, in name order: kubelet's own
/// `..data` links and `..2024_…` directories (names starting with a dot) left out.
pub fn mounted_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, ImportError> {
    let read = |e: std::io::Error| {
        ImportError::InvalidArgument(format!("reading directory {}: {e}", dir.display()))
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let entry = entry.map_err(read)?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows kubelet's symlinks.
        if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn read_file(path: &Path) -> Result<String, ImportError> {
    std::fs::read_to_string(path)
        .map_err(|e| ImportError::InvalidArgument(format!("reading {}: {e}", path.display())))
}

/// `--secret-dir`: the files `accessKeyId` and `secretKey` (CDI's Secret keys) → basic auth.
/// A trailing newline (`echo` into a file, `kubectl create secret --from-file`) is dropped.
pub fn basic_auth(dir: &Path) -> Result<(String, String), ImportError> {
    let key = |name: &str| -> Result<String, ImportError> {
        let s = read_file(&dir.join(name))?;
        Ok(s.strip_suffix('\n')
            .map(|s| s.strip_suffix('\r').unwrap_or(s))
            .unwrap_or(&s)
            .to_string())
    };
    Ok((key("accessKeyId")?, key("secretKey")?))
}

/// What the client sends besides the URL.
#[derive(Debug, Default)]
pub struct ClientOptions<'a> {
    pub cert_dir: Option<&'a Path>,
    pub headers: HeaderMap,
}

/// How long a connection may stay silent before the import fails (and kubelet retries).
const READ_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

pub fn client(opts: &ClientOptions<'_>) -> Result<reqwest::Client, ImportError> {
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .redirect(reqwest::redirect::Policy::limited(10))
        .user_agent(concat!("virt-importer/", env!("CARGO_PKG_VERSION")))
        .default_headers(opts.headers.clone());
    if let Some(dir) = opts.cert_dir {
        for file in mounted_files(dir)? {
            let pem = std::fs::read(&file).map_err(|e| {
                ImportError::InvalidArgument(format!("reading {}: {e}", file.display()))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                ImportError::InvalidArgument(format!(
                    "{}: not PEM certificates: {}",
                    file.display(),
                    chain(&e)
                ))
            })?;
            if certs.is_empty() {
                return Err(ImportError::InvalidArgument(format!(
                    "{}: no PEM certificate in it",
                    file.display()
                )));
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
    }
    b.build().map_err(|e| {
        ImportError::InvalidArgument(format!("building the HTTP client: {}", chain(&e)))
    })
}

/// An error with its causes, "a: b: c" (reqwest's own text is only the outermost).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// The URL as shown in messages: without user and password.
pub fn redact(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

/// A failed request or body read as an [`ImportError`].
pub fn connection_error(url: &str, e: &reqwest::Error) -> ImportError {
    let mut detail = chain(e);
    if let Some(u) = e.url() {
        // reqwest puts the (possibly redirected) URL in its text: shown once, redacted.
        detail = detail.replace(u.as_str(), &redact(u));
    }
    ImportError::Connection {
        url: url.to_string(),
        detail,
    }
}

/// Classifies a response status: success, 404, or another error.
pub fn check_status(url: &str, status: reqwest::StatusCode) -> Result<(), ImportError> {
    if status == reqwest::StatusCode::NOT_FOUND {
        Err(ImportError::HttpNotFound {
            url: url.to_string(),
        })
    } else if status.is_client_error() || status.is_server_error() {
        Err(ImportError::HttpStatus {
            url: url.to_string(),
            status: status.as_u16(),
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        let (n, v) = parse_header("X-Auth-Token:  abc def ").unwrap();
        assert_eq!(n.as_str(), "x-auth-token");
        assert_eq!(v, "abc def");
        // A colon in the value is part of it.
        let (n, v) = parse_header("Authorization: Bearer a:b").unwrap();
        assert_eq!(n, reqwest::header::AUTHORIZATION);
        assert_eq!(v, "Bearer a:b");
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("bad name: x").is_err());
        assert!(parse_header("X: a\nb").is_err());
    }

    #[test]
    fn status() {
        assert!(check_status("u", reqwest::StatusCode::OK).is_ok());
        assert_eq!(
            check_status("u", reqwest::StatusCode::NOT_FOUND)
                .unwrap_err()
                .reason(),
            "HTTPNotFound"
        );
        let e = check_status("http://h/x", reqwest::StatusCode::FORBIDDEN).unwrap_err();
        assert_eq!(e.reason(), "HTTPError");
        assert_eq!(e.to_string(), "http://h/x answered HTTP 403");
    }

    #[test]
    fn redacts_credentials() {
        let u = reqwest::Url::parse("https://me:secret@example.com/a.img?x=1").unwrap();
        assert_eq!(redact(&u), "https://example.com/a.img?x=1");
    }

    #[test]
    fn secret_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("accessKeyId"), "user\n").unwrap();
        std::fs::write(dir.path().join("secretKey"), "p:ss").unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        assert_eq!(
            basic_auth(dir.path()).unwrap(),
            ("user".to_string(), "p:ss".to_string())
        );
        let files = mounted_files(dir.path()).unwrap();
        assert_eq!(files.len(), 2);
        let e = basic_auth(&dir.path().join("missing")).unwrap_err();
        assert_eq!(e.reason(), "InvalidArgument");
    }
}
