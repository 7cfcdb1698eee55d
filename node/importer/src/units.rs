//! `--size`: bytes, or a Kubernetes quantity (`64Mi`, `1Gi`, `10G`).

/// Parses a size: an integer of bytes with an optional binary (Ki…Ei) or decimal (k, K, M,
/// G, T, P, E) suffix.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("size {s:?}: expected bytes or a quantity such as 64Mi"))?;
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        other => return Err(format!("size {s:?}: unknown suffix {other:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("64Mi"), Ok(64 << 20));
        assert_eq!(parse_size(" 1Gi "), Ok(1 << 30));
        assert_eq!(parse_size("10G"), Ok(10_000_000_000));
        assert!(parse_size("").is_err());
        assert!(parse_size("1.5Gi").is_err());
        assert!(parse_size("64MB").is_err());
        assert!(parse_size("20Ei").is_err());
    }
}
