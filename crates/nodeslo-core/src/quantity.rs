//! Validation of Kubernetes resource quantities (`resource.Quantity` text form).

/// True when `s` parses as a Kubernetes quantity: a signed decimal number followed by nothing, a
/// binary suffix (`Ki` .. `Ei`), a decimal suffix (`n u m k M G T P E`) or an exponent (`e3`, `E-2`).
pub fn is_valid_quantity(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let number_len = s
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = s.split_at(number_len);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.bytes().filter(|b| *b == b'.').count() > 1 {
        return false;
    }
    match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T"
        | "P" | "E" => true,
        exponent => exponent
            .strip_prefix(['e', 'E'])
            .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
            .is_some_and(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_quantities() {
        for q in [
            "0", "10G", "99M", "1.5Gi", "100m", "5e3", "1E-2", "+1k", "-2", ".5", "3.",
        ] {
            assert!(is_valid_quantity(q), "{q} must be valid");
        }
    }

    #[test]
    fn invalid_quantities() {
        for q in [
            "", "abc", "10GB", "1K", "1..2", "e3", "1e", "10 G", "G", "1Gi2",
        ] {
            assert!(!is_valid_quantity(q), "{q} must be invalid");
        }
    }
}
