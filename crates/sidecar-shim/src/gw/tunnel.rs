//! Tunnel health from interface counters (pure).
//!
//! Each check compares the tunnel's packet counters with the previous check. A
//! check in which packets went out and none came back is a 100% loss check;
//! after [`DOWN_AFTER_FULL_LOSS_CHECKS`] of them in a row the tunnel is DOWN
//! (KubeSlice's rule). A check without outgoing packets says nothing and leaves
//! the streak as it was; any returning packet resets it.

use std::time::Instant;

/// Consecutive 100% loss checks after which the tunnel is reported DOWN.
pub const DOWN_AFTER_FULL_LOSS_CHECKS: u32 = 20;

/// Interface counters at one check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
}

/// What the tracker derived from the last two checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TunnelHealth {
    /// Percent of packets sent in the last check without a packet coming back.
    pub packet_loss: u64,
    /// Bytes per second in the last check.
    pub tx_rate: u64,
    pub rx_rate: u64,
    pub consecutive_full_loss: u32,
}

impl TunnelHealth {
    pub fn is_down(&self) -> bool {
        self.consecutive_full_loss >= DOWN_AFTER_FULL_LOSS_CHECKS
    }
}

/// Follows one tunnel interface across checks.
#[derive(Debug, Clone, Default)]
pub struct TunnelTracker {
    interface: Option<String>,
    last: Option<(Counters, Instant)>,
    health: TunnelHealth,
}

impl TunnelTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// The interface is gone: forget everything about it.
    pub fn missing(&mut self) {
        *self = Self::default();
    }

    /// Records one check of `interface`.
    pub fn observe(&mut self, interface: &str, counters: Counters, at: Instant) -> TunnelHealth {
        if self.interface.as_deref() != Some(interface) {
            *self = Self {
                interface: Some(interface.to_owned()),
                ..Self::default()
            };
        }
        if let Some((previous, previous_at)) = self.last {
            // Counters only go down when the interface was recreated: start over.
            if counters.tx_packets < previous.tx_packets
                || counters.rx_packets < previous.rx_packets
            {
                self.health = TunnelHealth::default();
            } else {
                let tx = counters.tx_packets - previous.tx_packets;
                let rx = counters.rx_packets - previous.rx_packets;
                let millis = u64::try_from(at.saturating_duration_since(previous_at).as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1);
                let rate = |now: u64, before: u64| {
                    now.saturating_sub(before).saturating_mul(1000) / millis
                };
                self.health.tx_rate = rate(counters.tx_bytes, previous.tx_bytes);
                self.health.rx_rate = rate(counters.rx_bytes, previous.rx_bytes);
                match (tx - rx.min(tx)).saturating_mul(100).checked_div(tx) {
                    Some(loss) => {
                        self.health.packet_loss = loss;
                        if rx == 0 {
                            self.health.consecutive_full_loss =
                                self.health.consecutive_full_loss.saturating_add(1);
                        } else {
                            self.health.consecutive_full_loss = 0;
                        }
                    }
                    // Nothing sent: no evidence either way, unless something came back.
                    None => {
                        self.health.packet_loss = 0;
                        if rx > 0 {
                            self.health.consecutive_full_loss = 0;
                        }
                    }
                }
            }
        }
        self.last = Some((counters, at));
        self.health
    }

    pub fn interface(&self) -> Option<&str> {
        self.interface.as_deref()
    }

    pub fn health(&self) -> TunnelHealth {
        self.health
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    struct Clock(Instant);
    impl Clock {
        fn tick(&mut self) -> Instant {
            self.0 += Duration::from_secs(1);
            self.0
        }
    }

    fn counters(tx: u64, rx: u64) -> Counters {
        Counters {
            tx_packets: tx,
            rx_packets: rx,
            tx_bytes: tx * 100,
            rx_bytes: rx * 100,
        }
    }

    #[test]
    fn down_after_exactly_twenty_full_loss_checks() {
        let mut clock = Clock(Instant::now());
        let mut tracker = TunnelTracker::new();
        tracker.observe("tun0", counters(0, 0), clock.tick());
        for check in 1..=19 {
            let health = tracker.observe("tun0", counters(check * 5, 0), clock.tick());
            assert_eq!(health.packet_loss, 100);
            assert!(!health.is_down(), "check {check} must not be down yet");
        }
        let health = tracker.observe("tun0", counters(100, 0), clock.tick());
        assert_eq!(health.consecutive_full_loss, 20);
        assert!(health.is_down());
        // One packet back brings it up again.
        let health = tracker.observe("tun0", counters(105, 1), clock.tick());
        assert!(!health.is_down());
        assert_eq!(health.packet_loss, 80);
    }

    #[test]
    fn partial_loss_resets_the_streak_and_idle_checks_do_not_count() {
        let mut clock = Clock(Instant::now());
        let mut tracker = TunnelTracker::new();
        tracker.observe("tun0", counters(0, 0), clock.tick());
        for check in 1..=19 {
            tracker.observe("tun0", counters(check, 0), clock.tick());
        }
        // Idle: nothing sent, nothing received. The streak stays at 19.
        let idle = tracker.observe("tun0", counters(19, 0), clock.tick());
        assert_eq!((idle.packet_loss, idle.consecutive_full_loss), (0, 19));
        // 50% loss: not a full-loss check.
        let half = tracker.observe("tun0", counters(21, 1), clock.tick());
        assert_eq!((half.packet_loss, half.consecutive_full_loss), (50, 0));
    }

    #[test]
    fn rates_are_bytes_per_second() {
        let start = Instant::now();
        let mut tracker = TunnelTracker::new();
        tracker.observe("tun0", counters(0, 0), start);
        let health = tracker.observe("tun0", counters(20, 10), start + Duration::from_secs(2));
        assert_eq!((health.tx_rate, health.rx_rate), (1000, 500));
    }

    #[test]
    fn a_new_interface_or_counter_reset_starts_over() {
        let mut clock = Clock(Instant::now());
        let mut tracker = TunnelTracker::new();
        tracker.observe("tun0", counters(0, 0), clock.tick());
        tracker.observe("tun0", counters(10, 0), clock.tick());
        assert_eq!(tracker.health().consecutive_full_loss, 1);
        tracker.observe("tun1", counters(50, 0), clock.tick());
        assert_eq!(tracker.health(), TunnelHealth::default());
        assert_eq!(tracker.interface(), Some("tun1"));
        tracker.observe("tun1", counters(60, 0), clock.tick());
        tracker.observe("tun1", counters(3, 0), clock.tick());
        assert_eq!(tracker.health().consecutive_full_loss, 0);
        tracker.missing();
        assert_eq!(tracker.interface(), None);
    }
}
