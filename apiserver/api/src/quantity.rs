//! Parsing of Kubernetes resource quantities (`128Mi`, `1.5G`, `500m`, `1e3`).
//!
//! k8s-openapi's `Quantity` is only a string; the API server must reject bad values
//! with a field error and the node needs byte counts, so the grammar lives here.

use thiserror::Error;

/// A quantity string that does not follow the Kubernetes grammar.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)]
pub struct QuantityError;

/// Parses a quantity into its numeric value (`"1Ki"` → 1024.0, `"500m"` → 0.5).
pub fn parse(s: &str) -> Result<f64, QuantityError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(QuantityError);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num.matches('.').count() > 1 || num[1..].contains(['+', '-']) {
        return Err(QuantityError);
    }
    let digits = num.trim_start_matches(['+', '-']);
    if digits.is_empty() || digits == "." {
        return Err(QuantityError);
    }
    let value: f64 = num.parse().map_err(|_| QuantityError)?;
    let multiplier = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| QuantityError)?;
            10f64.powi(e)
        }
        _ => return Err(QuantityError),
    };
    Ok(value * multiplier)
}

/// Parses a quantity of bytes, rounding fractions up.
pub fn parse_bytes(s: &str) -> Result<u64, QuantityError> {
    let v = parse(s)?;
    if v < 0.0 || !v.is_finite() {
        return Err(QuantityError);
    }
    // Quantities above 2^64 bytes are not memory sizes anyone means.
    if v >= u64::MAX as f64 {
        return Err(QuantityError);
    }
    Ok(v.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 * 1024 * 1024));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("1.5Gi"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("1e3"), Ok(1000));
        assert_eq!(parse("500m"), Ok(0.5));
        assert_eq!(parse("2"), Ok(2.0));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "Mi", "12XB", "1..2", "1-2", "abc", "1 Mi", "-1Gi"] {
            assert!(parse_bytes(bad).is_err(), "{bad} should be rejected");
        }
    }
}
