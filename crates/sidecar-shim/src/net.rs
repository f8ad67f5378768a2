//! Address parsing shared by both sidecars (pure).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP prefix in canonical form: host bits cleared, like Go's `net.ParseCIDR`
/// network (so `10.1.2.3/16` and `10.1.0.0/16` name the same route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix_len: u8,
}

/// Why a prefix did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("missing '/<prefix length>'")]
    MissingPrefix,
    #[error("invalid address {0:?}")]
    Address(String),
    #[error("invalid prefix length {0:?}")]
    PrefixLen(String),
}

impl Cidr {
    /// A prefix from an address and a length; host bits are cleared.
    pub fn new(addr: IpAddr, prefix_len: u8) -> Result<Self, CidrError> {
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix_len > max {
            return Err(CidrError::PrefixLen(prefix_len.to_string()));
        }
        Ok(Self {
            network: mask(addr, prefix_len),
            prefix_len,
        })
    }

    /// The prefix covering exactly one address (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Self {
        let prefix_len = if addr.is_ipv4() { 32 } else { 128 };
        Self {
            network: addr,
            prefix_len,
        }
    }

    /// A prefix, or a bare address read as a host prefix.
    pub fn parse_prefix_or_host(text: &str) -> Result<Self, CidrError> {
        if text.contains('/') {
            text.parse()
        } else {
            parse_ip(text)
                .map(Self::host)
                .ok_or_else(|| CidrError::Address(text.to_owned()))
        }
    }

    pub fn network(&self) -> IpAddr {
        self.network
    }

    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    /// Whether `addr` lies inside this prefix.
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.is_ipv4() && mask(addr, self.prefix_len) == self.network
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (addr, len) = text
            .trim()
            .split_once('/')
            .ok_or(CidrError::MissingPrefix)?;
        let addr = parse_ip(addr).ok_or_else(|| CidrError::Address(addr.to_owned()))?;
        // Go accepts decimal digits only (no sign, no spaces).
        if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(CidrError::PrefixLen(len.to_owned()));
        }
        let len: u8 = len
            .parse()
            .map_err(|_| CidrError::PrefixLen(len.to_owned()))?;
        Self::new(addr, len)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

/// Parses an IPv4 or IPv6 address (surrounding spaces are not accepted, as in Go).
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    text.parse().ok()
}

fn mask(addr: IpAddr, prefix_len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let keep = u32::MAX
                .checked_shl(32 - u32::from(prefix_len))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & keep))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let keep = u128::MAX
                .checked_shl(128 - u32::from(prefix_len))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & keep))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().expect("valid cidr")
    }

    #[test]
    fn host_bits_are_cleared_like_go_parse_cidr() {
        assert_eq!(cidr("10.1.2.3/16").to_string(), "10.1.0.0/16");
        assert_eq!(cidr("10.1.2.3/16"), cidr("10.1.0.0/16"));
        assert_eq!(cidr("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(cidr("10.1.2.3/32").to_string(), "10.1.2.3/32");
        assert_eq!(cidr("fd00::1:2/64").to_string(), "fd00::/64");
        assert_eq!(cidr("fd00::1/0").to_string(), "::/0");
    }

    #[test]
    fn malformed_prefixes_are_rejected() {
        for bad in [
            "",
            "10.1.0.0",
            "10.1.0.0/",
            "10.1.0.0/33",
            "10.1.0/16",
            "10.1.0.0/+8",
            "10.1.0.0/-1",
            "fd00::/129",
            "subnet",
            "10.1.0.0/16/1",
            " /8",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} must not parse");
        }
    }

    #[test]
    fn bare_addresses_are_host_prefixes() {
        let host = Cidr::parse_prefix_or_host("10.1.1.1").expect("host");
        assert_eq!(host.to_string(), "10.1.1.1/32");
        assert_eq!(
            Cidr::parse_prefix_or_host("10.1.1.1/24")
                .expect("prefix")
                .to_string(),
            "10.1.1.0/24"
        );
        assert!(Cidr::parse_prefix_or_host("10.1.1").is_err());
    }

    #[test]
    fn contains_respects_family_and_prefix() {
        let net = cidr("10.1.0.0/16");
        assert!(net.contains("10.1.255.3".parse().expect("ip")));
        assert!(!net.contains("10.2.0.1".parse().expect("ip")));
        assert!(!net.contains("::ffff:10.1.0.1".parse().expect("ip")));
    }
}
