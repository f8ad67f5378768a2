//! Kernel state read once and answered from memory until a netlink notification says it changed.
//!
//! A dump per gRPC call (links, addresses, the route table), serialized on one socket, made the
//! kernel backends several times slower than an empty handler. [`Cached`] keeps the last dump and
//! a non-blocking socket subscribed to the matching multicast groups; every read first drains that
//! socket (one `recv` that answers EAGAIN when nothing changed). The kernel queues a notification
//! before the change's own syscall returns, so a change made before a request arrived is always
//! seen by it: no background task, no window where a stale answer is served.

use std::path::Path;
use std::sync::Mutex;
use std::sync::PoisonError;

use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr};

use crate::backend::BackendError;

/// `RTMGRP_*` bits (linux/rtnetlink.h) for [`Cached::subscribe`].
pub mod groups {
    pub const LINK: u32 = 1;
    pub const IPV4_IFADDR: u32 = 0x10;
    pub const IPV4_ROUTE: u32 = 0x40;
    pub const IPV6_ROUTE: u32 = 0x400;
}

/// A value computed from kernel dumps, valid while no notification of `groups` arrived.
#[derive(Debug)]
pub struct Cached<T> {
    /// Notifications of the subscribed groups (contents ignored: any means "dump again").
    socket: Socket,
    state: Mutex<State<T>>,
    /// One refresh at a time: concurrent readers that missed wait for it and share its result.
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct State<T> {
    /// Moves on every notification (or socket error, such as ENOBUFS after an overflow).
    generation: u64,
    value: Option<(u64, T)>,
}

impl<T: Clone> Cached<T> {
    /// Subscribes to `groups` in the namespace at `netns` (or this process's own); nothing is
    /// cached until the first read.
    pub fn subscribe(netns: Option<&Path>, groups: u32) -> Result<Self, BackendError> {
        let socket = crate::netns::in_namespace(netns, move || {
            let mut socket = Socket::new(NETLINK_ROUTE)?;
            socket.bind(&SocketAddr::new(0, groups))?;
            socket.set_non_blocking(true)?;
            Ok(socket)
        })?;
        Ok(Self {
            socket,
            state: Mutex::new(State {
                generation: 0,
                value: None,
            }),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    /// The cached value if nothing changed since it was read, else the result of `refresh`
    /// (which is kept for the next reads).
    pub async fn get<F, Fut>(&self, refresh: F) -> Result<T, BackendError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, BackendError>>,
    {
        if let (_, Some(value)) = self.current() {
            return Ok(value);
        }
        let _refreshing = self.refreshing.lock().await;
        // Another reader may have refreshed while this one waited.
        let (generation, value) = self.current();
        if let Some(value) = value {
            return Ok(value);
        }
        let fresh = refresh().await?;
        let mut state = self.lock();
        // Stored with the generation seen before the dump: a change drained meanwhile makes it
        // stale at once.
        state.value = Some((generation, fresh.clone()));
        Ok(fresh)
    }

    /// Drains the notifications; returns the generation and the value if it is still current.
    fn current(&self) -> (u64, Option<T>) {
        let mut state = self.lock();
        if self.drain() {
            state.generation += 1;
        }
        let generation = state.generation;
        let value = match &state.value {
            Some((at, value)) if *at == generation => Some(value.clone()),
            _ => None,
        };
        (generation, value)
    }

    /// True when anything arrived (or the socket reported an error, e.g. lost notifications).
    fn drain(&self) -> bool {
        // The contents do not matter: a short buffer truncates (and discards) each datagram.
        let mut storage = [0u8; 64];
        let mut changed = false;
        // Bounded: a flood of notifications only needs to be noticed, not read to the end.
        for _ in 0..64 {
            let mut buffer: &mut [u8] = &mut storage;
            match self.socket.recv(&mut buffer, 0) {
                Ok(_) => changed = true,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return changed,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
