//! The pod IP pool: distinct addresses from one IPv4 CIDR (default inside 127.0.0.0/8, so a
//! process can bind its pod's IP on loopback).

use super::WorkloadError;
use std::collections::HashSet;
use std::net::Ipv4Addr;

/// An IPv4 range handing out the lowest free address (network and broadcast excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPool {
    first: u32,
    last: u32,
}

impl IpPool {
    pub fn parse(cidr: &str) -> Result<Self, WorkloadError> {
        let bad = || WorkloadError::InvalidCidr(cidr.to_string());
        let (addr, len) = cidr.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let len: u32 = len.parse().map_err(|_| bad())?;
        if !(8..=30).contains(&len) {
            return Err(bad());
        }
        let mask = u32::MAX << (32 - len);
        let network = u32::from(addr) & mask;
        Ok(Self {
            first: network + 1,
            last: (network | !mask) - 1,
        })
    }

    pub fn allocate(&self, taken: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        (self.first..=self.last)
            .map(Ipv4Addr::from)
            .find(|ip| !taken.contains(ip))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&u32::from(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_hand_out_distinct_lowest_free_addresses() {
        let pool = IpPool::parse("127.10.0.0/16").expect("valid");
        let mut taken = HashSet::new();
        let a = pool.allocate(&taken).expect("free");
        assert_eq!(a, Ipv4Addr::new(127, 10, 0, 1));
        taken.insert(a);
        let b = pool.allocate(&taken).expect("free");
        assert_eq!(b, Ipv4Addr::new(127, 10, 0, 2));
        taken.remove(&a);
        assert_eq!(
            pool.allocate(&taken),
            Some(a),
            "released addresses are reused"
        );
        let tiny = IpPool::parse("10.0.0.0/30").expect("valid");
        let full: HashSet<_> = [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)].into();
        assert_eq!(tiny.allocate(&full), None);
        assert!(IpPool::parse("127.0.0.1").is_err());
        assert!(IpPool::parse("300.0.0.0/8").is_err());
    }
}
