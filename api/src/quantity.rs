//! CPU and memory quantities, as users write them in `resources`.
//!
//! CPU is kept in millicores (`100m` = 100, `1.5` = 1500) and memory in bytes
//! (`64Mi`, `1Gi`, `500M`, `1.5Gi`). Parsing is exact integer arithmetic with overflow checks:
//! a quantity that does not fit in a `u64` is an error, never a wrap-around.

use std::fmt;

/// CPU in thousandths of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MilliCpu(pub u64);

/// Memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bytes(pub u64);

/// Why a text is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a CPU quantity; it holds the text.
    #[error("{0:?} is not a CPU quantity (expected e.g. 100m, 1, 1.5)")]
    NotCpu(String),
    /// Not a memory quantity; it holds the text.
    #[error("{0:?} is not a memory quantity (expected e.g. 64Mi, 1Gi, 500M)")]
    NotMemory(String),
    /// A quantity too large for a `u64`; it holds the text.
    #[error("{0:?} is too large")]
    Overflow(String),
}

impl MilliCpu {
    /// Parses `100m`, `1` or `1.5`; finer than a millicore is an error.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let not_cpu = || QuantityError::NotCpu(s.to_string());
        if let Some(milli) = s.strip_suffix('m') {
            if milli.is_empty() || !milli.bytes().all(|b| b.is_ascii_digit()) {
                return Err(not_cpu());
            }
            return milli
                .parse::<u64>()
                .map(MilliCpu)
                .map_err(|_| QuantityError::Overflow(s.to_string()));
        }
        let (whole, frac) = split_decimal(s).ok_or_else(not_cpu)?;
        if frac.len() > 3 {
            // Finer than a millicore cannot be enforced; say so rather than round silently.
            return Err(not_cpu());
        }
        let scaled = scale_decimal(whole, frac, 1000)
            .ok_or_else(|| QuantityError::Overflow(s.to_string()))?;
        Ok(MilliCpu(scaled))
    }

    /// The value in cores.
    pub fn cores(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl fmt::Display for MilliCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

const MEMORY_SUFFIXES: [(&str, u64); 12] = [
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("Pi", 1 << 50),
    ("Ei", 1 << 60),
    ("k", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000),
];

impl Bytes {
    /// Parses a number of bytes, with an optional suffix (`Ki`…`Ei`, `k`…`E`); a fraction of a byte is rounded up.
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let not_memory = || QuantityError::NotMemory(s.to_string());
        let (number, unit) = MEMORY_SUFFIXES
            .iter()
            .find_map(|(suffix, unit)| s.strip_suffix(suffix).map(|n| (n, *unit)))
            .unwrap_or((s, 1));
        let (whole, frac) = split_decimal(number).ok_or_else(not_memory)?;
        if unit == 1 && !frac.is_empty() {
            return Err(not_memory()); // fractional bytes
        }
        // Exact: whole*unit + ceil(frac*unit / 10^len(frac)).
        let overflow = || QuantityError::Overflow(s.to_string());
        let whole_bytes = whole
            .parse::<u64>()
            .ok()
            .and_then(|w| w.checked_mul(unit))
            .ok_or_else(overflow)?;
        let frac_bytes = if frac.is_empty() {
            0
        } else {
            // 18 fractional digits are finer than a byte for every unit up to Ei; more is
            // noise, not precision, and would overflow the arithmetic below.
            if frac.len() > 18 {
                return Err(not_memory());
            }
            let denom = 10u128.pow(frac.len() as u32);
            let numer = frac.parse::<u128>().map_err(|_| not_memory())? * unit as u128;
            u64::try_from(numer.div_ceil(denom)).map_err(|_| overflow())?
        };
        whole_bytes
            .checked_add(frac_bytes)
            .map(Bytes)
            .ok_or_else(overflow)
    }

    /// The value in mebibytes.
    pub fn mebibytes(self) -> f64 {
        self.0 as f64 / (1u64 << 20) as f64
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (suffix, unit) in MEMORY_SUFFIXES.iter().take(6).rev() {
            if self.0 != 0 && self.0.is_multiple_of(*unit) {
                return write!(f, "{}{}", self.0 / unit, suffix);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// Split `"12.345"` into `("12", "345")`; digits only, at least one digit before the dot,
/// and at least one after it if there is a dot.
fn split_decimal(s: &str) -> Option<(&str, &str)> {
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) if !f.is_empty() => (w, f),
        Some(_) => return None,
        None => (s, ""),
    };
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    (!whole.is_empty() && digits(whole) && digits(frac)).then_some((whole, frac))
}

/// `whole.frac * scale`, where `frac` has at most log10(scale) digits.
fn scale_decimal(whole: &str, frac: &str, scale: u64) -> Option<u64> {
    let mut value = whole.parse::<u64>().ok()?.checked_mul(scale)?;
    if !frac.is_empty() {
        let pad = scale / 10u64.pow(frac.len() as u32);
        value = value.checked_add(frac.parse::<u64>().ok()? * pad)?;
    }
    Some(value)
}

/// A size the way the Quadlet files write them (`64Mi`), with a decimal where a whole number
/// would hide most of it (a 2.4 MiB backup is not "2Mi", a 300 KiB one not "0Mi").
pub fn format_bytes(n: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;
    match n {
        _ if n >= GIB => format!("{:.1}Gi", n as f64 / GIB as f64),
        _ if n >= 10 * MIB || n.is_multiple_of(MIB) && n > 0 => format!("{}Mi", n / MIB),
        _ if n >= MIB => format!("{:.1}Mi", n as f64 / MIB as f64),
        _ if n >= KIB => format!("{}Ki", n / KIB),
        _ => format!("{n}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_keep_what_matters() {
        assert_eq!(format_bytes(64 << 20), "64Mi");
        assert_eq!(format_bytes(2_516_582), "2.4Mi");
        assert_eq!(format_bytes(25 << 20 | 12345), "25Mi");
        assert_eq!(format_bytes(307_200), "300Ki");
        assert_eq!(format_bytes(512), "512B");
        assert_eq!(format_bytes(0), "0B");
        assert_eq!(format_bytes(3 << 30), "3.0Gi");
    }

    #[test]
    fn cpu_forms() {
        assert_eq!(MilliCpu::parse("100m"), Ok(MilliCpu(100)));
        assert_eq!(MilliCpu::parse("1"), Ok(MilliCpu(1000)));
        assert_eq!(MilliCpu::parse("1.5"), Ok(MilliCpu(1500)));
        assert_eq!(MilliCpu::parse("0.25"), Ok(MilliCpu(250)));
        assert_eq!(MilliCpu::parse("2.125"), Ok(MilliCpu(2125)));
    }

    #[test]
    fn cpu_rejects() {
        for bad in [
            "", "m", "1.", ".5", "-1", "1.2345", "1 m", "one", "1.5m", "1e3", "0x10",
        ] {
            assert!(
                matches!(MilliCpu::parse(bad), Err(QuantityError::NotCpu(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            MilliCpu::parse("99999999999999999999m"),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            MilliCpu::parse("18446744073709551615"),
            Err(QuantityError::Overflow(_))
        ));
    }

    #[test]
    fn memory_forms() {
        assert_eq!(Bytes::parse("64Mi"), Ok(Bytes(64 << 20)));
        assert_eq!(Bytes::parse("1Gi"), Ok(Bytes(1 << 30)));
        assert_eq!(Bytes::parse("500M"), Ok(Bytes(500_000_000)));
        assert_eq!(Bytes::parse("1.5Gi"), Ok(Bytes(3 << 29)));
        assert_eq!(Bytes::parse("1024"), Ok(Bytes(1024)));
        assert_eq!(Bytes::parse("1k"), Ok(Bytes(1000)));
        assert_eq!(Bytes::parse("0.1Ki"), Ok(Bytes(103))); // rounded up, never down
    }

    #[test]
    fn memory_rejects() {
        for bad in [
            "64MB", "", "Mi", "1.5", "-1Mi", "1 Gi", "1gi", "1.Mi", "1e9",
        ] {
            assert!(
                matches!(Bytes::parse(bad), Err(QuantityError::NotMemory(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Bytes::parse("16Ei"),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            Bytes::parse("99999999999999999999"),
            Err(QuantityError::Overflow(_))
        ));
    }

    #[test]
    fn error_message_names_value_and_expectation() {
        let err = Bytes::parse("64MB").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#""64MB" is not a memory quantity (expected e.g. 64Mi, 1Gi, 500M)"#
        );
    }

    #[test]
    fn display_round_trips() {
        for s in ["64Mi", "1Gi", "1000", "100m", "2"] {
            if s.ends_with('m') || s.chars().all(|c| c.is_ascii_digit()) && s.len() == 1 {
                assert_eq!(MilliCpu::parse(s).unwrap().to_string(), s);
            } else {
                assert_eq!(Bytes::parse(s).unwrap().to_string(), s);
            }
        }
    }
}

/// A quantity a type can be parsed from (`MilliCpu`, `Bytes`).
pub trait ParseQuantity: Sized {
    /// Parses `text` as this quantity.
    fn parse_quantity(text: &str) -> Result<Self, QuantityError>;
}

impl ParseQuantity for MilliCpu {
    fn parse_quantity(text: &str) -> Result<Self, QuantityError> {
        MilliCpu::parse(text)
    }
}

impl ParseQuantity for Bytes {
    fn parse_quantity(text: &str) -> Result<Self, QuantityError> {
        Bytes::parse(text)
    }
}

/// An amount as written in a Quadlet file (`500m`, `0.5`, `256Mi`), parsed once, when the
/// file is read. It is written back (stored, hashed) exactly as the user wrote it, so a
/// template's hash never depends on how KAT would spell the value; one that does not parse
/// is kept with its error, for validation to report against its field with every other
/// finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Amount<T> {
    text: String,
    parsed: Result<T, QuantityError>,
}

impl<T: ParseQuantity + Copy> Amount<T> {
    /// Parses `text` and keeps it as written.
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let parsed = T::parse_quantity(&text);
        Amount { text, parsed }
    }

    /// As written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The value, or why the text is not one.
    pub fn parsed(&self) -> Result<T, &QuantityError> {
        self.parsed.as_ref().copied()
    }

    /// The value, if the text is one.
    pub fn value(&self) -> Option<T> {
        self.parsed.as_ref().ok().copied()
    }
}

impl<T> serde::Serialize for Amount<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de, T: ParseQuantity + Copy> serde::Deserialize<'de> for Amount<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Amount::new)
    }
}

#[cfg(test)]
mod amount_tests {
    use super::*;

    /// Parsed once, written back as written (so "0.5" stays "0.5" and hashes the same), and
    /// a bad one keeps its error.
    #[test]
    fn an_amount_keeps_its_text_and_its_value() {
        let cpu: Amount<MilliCpu> = serde_json::from_str("\"0.5\"").unwrap();
        assert_eq!(cpu.value(), Some(MilliCpu(500)));
        assert_eq!(serde_json::to_string(&cpu).unwrap(), "\"0.5\"");
        let mem: Amount<Bytes> = serde_json::from_str("\"lots\"").unwrap();
        assert_eq!(mem.value(), None);
        assert!(matches!(mem.parsed(), Err(QuantityError::NotMemory(t)) if t == "lots"));
        assert_eq!(mem.text(), "lots");
    }
}
