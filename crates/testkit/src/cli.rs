//! Command-line checks: a bad flag value is refused by clap before anything starts, with a message
//! that names the flag and says what to fix.

/// Parses `argv` as `P` and asserts that clap refused it as an invalid value, with a message that
/// names `flag` and contains `reason`; returns the message for further checks.
#[track_caller]
pub fn assert_refused<P: clap::Parser + std::fmt::Debug>(
    argv: &[&str],
    flag: &str,
    reason: &str,
) -> String {
    let err = P::try_parse_from(argv).expect_err("the command line is refused");
    assert_eq!(
        err.kind(),
        clap::error::ErrorKind::ValueValidation,
        "refused as an invalid value: {err}"
    );
    let text = err.to_string();
    assert!(text.contains(flag), "the message names {flag}: {text}");
    assert!(text.contains(reason), "the message says {reason:?}: {text}");
    text
}

#[cfg(test)]
mod tests {
    use super::assert_refused;

    #[derive(clap::Parser, Debug)]
    struct Args {
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
        workers: u16,
    }

    #[test]
    fn a_refused_value_passes_and_an_accepted_one_or_another_reason_fails() {
        let text = assert_refused::<Args>(&["x", "--workers", "0"], "--workers", "0 is not in");
        assert!(text.contains("1..=65535"), "{text}");
        let accepted = std::panic::catch_unwind(|| {
            assert_refused::<Args>(&["x", "--workers", "3"], "--workers", "")
        });
        assert!(
            accepted.is_err(),
            "an accepted command line fails the check"
        );
        let other = std::panic::catch_unwind(|| {
            assert_refused::<Args>(&["x", "--workers", "0"], "--workers", "must be at least 1")
        });
        assert!(other.is_err(), "another message fails the check");
    }
}
