//! Admission of unauthenticated push-notification bodies: how many are read at once in all
//! ([`HOOK_READS_AT_ONCE`]) and from one source ([`HOOK_READS_PER_SOURCE`]). A body is read
//! before its HMAC can be checked, so these bounds are what a stranger can make the API
//! hold: at most `HOOK_READS_AT_ONCE` × the body limit, and a few slow senders from one
//! place cannot take every slot and keep the git servers' notifications out.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};

/// Push notifications read at once, none authenticated yet. One more gets a 503 at once
/// (the git server shows the failed delivery, to be sent again).
pub const HOOK_READS_AT_ONCE: usize = 8;
/// Of those, how many one source may hold: an IPv4 address, or an IPv6 /64 (one host's
/// usual allocation: counting addresses there would count nothing).
pub const HOOK_READS_PER_SOURCE: usize = 2;

static READS: Semaphore = Semaphore::const_new(HOOK_READS_AT_ONCE);
static BY_SOURCE: Mutex<BTreeMap<IpAddr, usize>> = Mutex::new(BTreeMap::new());

/// Why a body is not read now.
pub enum Refused {
    /// Every slot is held.
    Full,
    /// This source holds its share.
    SourceFull,
}

/// A slot for reading one body; given back when dropped.
pub struct HookRead {
    _permit: SemaphorePermit<'static>,
    source: IpAddr,
}

impl HookRead {
    /// A slot for a body from `client`, if one is free for it.
    pub fn admit(client: IpAddr) -> Result<HookRead, Refused> {
        let source = source_of(client);
        let mut held = BY_SOURCE.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(&source).copied().unwrap_or(0) >= HOOK_READS_PER_SOURCE {
            return Err(Refused::SourceFull);
        }
        // The slot first: a source is counted only while it holds one, so the map never
        // holds more entries than there are slots.
        let permit = READS.try_acquire().map_err(|_| Refused::Full)?;
        *held.entry(source).or_insert(0) += 1;
        Ok(HookRead {
            _permit: permit,
            source,
        })
    }
}

impl Drop for HookRead {
    fn drop(&mut self) {
        let mut held = BY_SOURCE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&self.source) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.source);
            }
        }
    }
}

/// The unit one sender is counted by.
fn source_of(client: IpAddr) -> IpAddr {
    match client.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_host_is_counted_by_its_64() {
        let a = source_of("2001:db8:1:2::1".parse().unwrap());
        let b = source_of("2001:db8:1:2:ffff::9".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, source_of("2001:db8:1:3::1".parse().unwrap()));
        assert_eq!(
            source_of("::ffff:10.0.0.1".parse().unwrap()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
    }
}
