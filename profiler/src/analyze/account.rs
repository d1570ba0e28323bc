//! A GPU's main feeder's account, kept whole for the what-if replay: every
//! moment of the feeder's time by the attribution's cause. A long run's
//! account is millions of moments, so each is kept in 16 bytes, with no
//! more of who decided it than the replay asks: the feeder itself, another
//! thread (a loader it waited on; which ones, the feeder keeps apart), or
//! nobody; and they are spooled (`crate::spool`), compressed and, once
//! large, out of memory.

use std::collections::HashMap;

use super::attribute::{Cause, Piece, Tid};
use crate::spool::Spool;

/// Whose state decided a moment's cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Nobody,
    Feeder,
    /// A thread the feeder waited on.
    Other,
}

/// One moment of the account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    pub start: u64,
    pub end: u64,
    pub cause: Cause,
    pub who: Who,
}

/// A moment as kept: its length in a u32 of ns, up to [`LONG`]; its cause
/// and who decided it by their places in [`Cause::ALL`] and [`WHO`].
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Packed {
    start: u64,
    len: u32,
    cause: u8,
    who: u8,
    _pad: [u8; 2],
}

const _: () = assert!(std::mem::size_of::<Packed>() == 16);

const WHO: [Who; 3] = [Who::Nobody, Who::Feeder, Who::Other];

/// A length that does not fit: the end is in [`Account::long`].
const LONG: u32 = u32::MAX;

/// The moments, in time order, spooled: a long run's account is hundreds
/// of MiB, and the replay reads it in order.
#[derive(Default)]
pub struct Account {
    moments: Spool<Packed>,
    /// Ends of the moments of 4.3 s or more (start-up, a long wait), by
    /// index.
    long: HashMap<usize, u64>,
    /// Time the feeder itself waited for a CPU others held, summed as the
    /// moments come: the report asks it once, and a walk of a long
    /// account reads every block back.
    contended_ns: u64,
    /// Where each wait for a request ended and the next began, as the
    /// moments come (see [`Account::between_requests`]).
    requests: BetweenRequests,
}

/// Each stretch from the end of one wait for a request to the start of
/// the next: a request's candidates, before the GPU's work says which
/// were requests.
#[derive(Default)]
struct BetweenRequests {
    waiting: bool,
    arrived: Option<u64>,
    between: Vec<(u64, u64)>,
}

impl Account {
    /// Adds the next piece of the feeder `feeder`'s account.
    pub fn push(&mut self, p: &Piece, feeder: Tid) {
        let who = match p.thread {
            None => Who::Nobody,
            Some(t) if t == feeder => Who::Feeder,
            Some(_) => Who::Other,
        };
        let len = match u32::try_from(p.end - p.start) {
            Ok(len) if len < LONG => len,
            _ => {
                self.long.insert(self.moments.len(), p.end);
                LONG
            }
        };
        if who == Who::Feeder && p.cause == Cause::CpuContention {
            self.contended_ns += p.end - p.start;
        }
        let r = &mut self.requests;
        let demand = p.cause == Cause::Demand;
        if demand && !r.waiting {
            if let Some(a) = r.arrived.take() {
                r.between.push((a, p.start));
            }
        }
        if !demand && r.waiting {
            r.arrived = Some(p.start);
        }
        r.waiting = demand;
        self.moments.push(Packed {
            start: p.start,
            len,
            cause: Cause::ALL.iter().position(|&c| c == p.cause).unwrap_or(0) as u8,
            who: WHO.iter().position(|&w| w == who).unwrap_or(0) as u8,
            _pad: [0; 2],
        });
    }

    pub fn len(&self) -> usize {
        self.moments.len()
    }

    /// Time the feeder itself waited for a CPU that others held.
    pub fn contended_ns(&self) -> u64 {
        self.contended_ns
    }

    /// Each `[woken, next wait)` between two waits for a request, in
    /// order: from the end of a wait to the start of the next one (a
    /// wait the account ends in closes none).
    pub fn between_requests(&self) -> &[(u64, u64)] {
        &self.requests.between
    }

    pub fn is_empty(&self) -> bool {
        self.moments.is_empty()
    }

    /// Reads the moments by index, near where it last read.
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            moments: self.moments.reader(),
            long: &self.long,
        }
    }

    pub fn first(&self) -> Option<Moment> {
        self.reader().get(0)
    }

    pub fn last(&self) -> Option<Moment> {
        self.reader().get(self.len().checked_sub(1)?)
    }

    pub fn iter(&self) -> impl Iterator<Item = Moment> + '_ {
        let mut r = self.reader();
        (0..self.len()).map_while(move |i| r.get(i))
    }

    /// Why its moments could not all be kept out of memory, if they could
    /// not.
    pub fn kept_in_memory(&self) -> Option<&str> {
        self.moments.kept_in_memory()
    }
}

/// A reader of an [`Account`].
pub struct Reader<'a> {
    moments: crate::spool::Reader<'a, Packed>,
    long: &'a HashMap<usize, u64>,
}

impl Reader<'_> {
    /// Moment `i`; None past the end (or when it could not be read back:
    /// see [`Reader::failed`]).
    pub fn get(&mut self, i: usize) -> Option<Moment> {
        let m = self.moments.get(i)?;
        let end = match m.len {
            LONG => *self.long.get(&i)?,
            len => m.start + len as u64,
        };
        Some(Moment {
            start: m.start,
            end,
            cause: *Cause::ALL.get(m.cause as usize)?,
            who: *WHO.get(m.who as usize)?,
        })
    }

    /// Why part of the account could not be read back, if it could not.
    pub fn failed(&self) -> Option<&str> {
        self.moments.failed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_read_back_as_pushed_long_ones_too() {
        let (feeder, loader) = ((1, 1), (2, 2));
        let pieces = [
            (0, 10, Cause::CpuHost, Some(feeder)),
            (10, 10 + (5 << 32), Cause::InputIo, Some(loader)),
            (10 + (5 << 32), 11 + (5 << 32), Cause::Unattributed, None),
        ];
        let mut a = Account::default();
        for (start, end, cause, thread) in pieces {
            let p = Piece {
                start,
                end,
                cause,
                thread,
            };
            a.push(&p, feeder);
        }
        let got: Vec<(u64, u64, Cause, Who)> =
            a.iter().map(|m| (m.start, m.end, m.cause, m.who)).collect();
        assert_eq!(
            got,
            [
                (0, 10, Cause::CpuHost, Who::Feeder),
                (10, 10 + (5 << 32), Cause::InputIo, Who::Other),
                (
                    10 + (5 << 32),
                    11 + (5 << 32),
                    Cause::Unattributed,
                    Who::Nobody
                ),
            ]
        );
        assert_eq!(a.last().map(|m| m.end), Some(11 + (5 << 32)));
    }
}
