//! `--checksum ALGORITHM:HEX` (a DataVolume's `source.http.checksum`), computed over the
//! bytes as received (before decompression), as CDI does.

use md5::Digest as _;

/// Digest algorithms accepted in `--checksum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Md5,
    Sha1,
    Sha256,
    Sha512,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Md5 => "md5",
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        }
    }

    /// Length of the digest in hex digits.
    fn hex_len(self) -> usize {
        match self {
            Algorithm::Md5 => 32,
            Algorithm::Sha1 => 40,
            Algorithm::Sha256 => 64,
            Algorithm::Sha512 => 128,
        }
    }
}

/// An expected digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    pub algorithm: Algorithm,
    /// Lower-case hex.
    pub hex: String,
}

impl std::str::FromStr for Checksum {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (alg, hex) = s
            .split_once(':')
            .ok_or_else(|| format!("checksum {s:?}: expected ALGORITHM:HEX, e.g. sha256:…"))?;
        let algorithm = match alg.trim().to_ascii_lowercase().as_str() {
            "md5" => Algorithm::Md5,
            "sha1" => Algorithm::Sha1,
            "sha256" => Algorithm::Sha256,
            "sha512" => Algorithm::Sha512,
            other => {
                return Err(format!(
                    "checksum algorithm {other:?} is not supported (md5, sha1, sha256, sha512)"
                ));
            }
        };
        let hex = hex.trim().to_ascii_lowercase();
        if hex.len() != algorithm.hex_len() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "checksum {s:?}: a {} digest is {} hex digits",
                algorithm.name(),
                algorithm.hex_len()
            ));
        }
        Ok(Checksum { algorithm, hex })
    }
}

/// A running digest.
#[derive(Debug, Clone)]
pub enum Hasher {
    Md5(md5::Md5),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl Hasher {
    pub fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Md5 => Hasher::Md5(md5::Md5::new()),
            Algorithm::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            Algorithm::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Algorithm::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Md5(h) => h.update(data),
            Hasher::Sha1(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }

    /// Lower-case hex.
    pub fn finish(self) -> String {
        match self {
            Hasher::Md5(h) => hex::encode(h.finalize()),
            Hasher::Sha1(h) => hex::encode(h.finalize()),
            Hasher::Sha256(h) => hex::encode(h.finalize()),
            Hasher::Sha512(h) => hex::encode(h.finalize()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let c: Checksum = "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"
            .parse()
            .unwrap();
        assert_eq!(c.algorithm, Algorithm::Sha256);
        assert_eq!(
            c.hex,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let c: Checksum = "MD5:d41d8cd98f00b204e9800998ecf8427e".parse().unwrap();
        assert_eq!(c.algorithm, Algorithm::Md5);
    }

    #[test]
    fn refuses() {
        for bad in [
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha256:abc",
            "sha256:zz",
            "crc32:deadbeef",
            "sha1:d41d8cd98f00b204e9800998ecf8427e",
        ] {
            assert!(bad.parse::<Checksum>().is_err(), "{bad}");
        }
        let e = "crc32:00".parse::<Checksum>().unwrap_err();
        assert!(e.contains("sha256"), "{e}");
    }

    #[test]
    fn digests_of_empty_input() {
        let empty = |a| Hasher::new(a).finish();
        assert_eq!(empty(Algorithm::Md5), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(
            empty(Algorithm::Sha1),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        assert_eq!(
            empty(Algorithm::Sha256),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(empty(Algorithm::Sha512).starts_with("cf83e1357eefb8bdf1542850d66d8007"));
        let mut h = Hasher::new(Algorithm::Sha256);
        h.update(b"ab");
        h.update(b"c");
        assert_eq!(
            h.finish(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
