//! What one call does, and the sizes it is run at.

use serde::Serialize;

/// The shape of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// N bytes out, the same N bytes back.
    Echo,
    /// N bytes out, an 8-byte length back (large request, small response).
    Upload,
    /// An 8-byte length out, N bytes back (small request, large response).
    Download,
}

impl Workload {
    /// Payload bytes of the request and of the response for size `n` (before encoding).
    pub fn bytes(self, n: usize) -> (usize, usize) {
        match self {
            Workload::Echo => (n, n),
            Workload::Upload => (n, 8),
            Workload::Download => (8, n),
        }
    }

    /// The name used in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Echo => "echo",
            Workload::Upload => "upload",
            Workload::Download => "download",
        }
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses a size: `32`, `4K`, `4KiB`, `1M`, `64MiB`, `1G` (binary multiples).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}: expected e.g. 32, 4K, 1M"))?;
    let shift = match unit.trim().to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        _ => return Err(format!("bad size unit in {s:?}: use K, M or G")),
    };
    n.checked_mul(1usize << shift).ok_or_else(|| format!("size {s:?} overflows"))
}

/// Formats a size the way [`parse_size`] reads it: `32`, `4K`, `1M`.
pub fn format_size(n: usize) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// Sizes from `lo` to `hi` inclusive, each `step` times the previous (step at least 2).
pub fn sweep(lo: usize, hi: usize, step: usize) -> Vec<usize> {
    let step = step.max(2);
    let mut out = Vec::new();
    let mut n = lo.max(1);
    while n <= hi {
        out.push(n);
        match n.checked_mul(step) {
            Some(next) => n = next,
            None => break,
        }
    }
    if out.last() != Some(&hi) && hi >= lo {
        out.push(hi);
    }
    out
}

/// Parses a size list: `8,64,1K` or a sweep `8:64M` (every power of `step` in between).
pub fn parse_sizes(s: &str, step: usize) -> Result<Vec<usize>, String> {
    if let Some((lo, hi)) = s.split_once(':') {
        let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
        if lo > hi {
            return Err(format!("empty sweep {s:?}"));
        }
        return Ok(sweep(lo, hi, step));
    }
    s.split(',').filter(|p| !p.trim().is_empty()).map(parse_size).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("32"), Ok(32));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("64MB"), Ok(64 << 20));
        assert!(parse_size("4X").is_err());
        assert!(parse_size("K").is_err());
    }

    #[test]
    fn sizes_format_back() {
        for n in [8, 100, 4096, 1 << 20, 3 << 20, 1 << 30] {
            assert_eq!(parse_size(&format_size(n)), Ok(n));
        }
        assert_eq!(format_size(4096), "4K");
    }

    #[test]
    fn sweeps_are_powers_of_the_step_and_end_at_hi() {
        assert_eq!(parse_sizes("8:128", 2), Ok(vec![8, 16, 32, 64, 128]));
        assert_eq!(parse_sizes("8:100", 4), Ok(vec![8, 32, 100]));
        assert_eq!(parse_sizes("8,1K", 4), Ok(vec![8, 1024]));
        assert!(parse_sizes("1M:8", 2).is_err());
    }

    #[test]
    fn workload_bytes_follow_the_direction() {
        assert_eq!(Workload::Echo.bytes(100), (100, 100));
        assert_eq!(Workload::Upload.bytes(100), (100, 8));
        assert_eq!(Workload::Download.bytes(100), (8, 100));
    }
}
