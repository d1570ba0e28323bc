//! A GPU's main feeder's account, kept whole for the what-if replay: every
//! moment of the feeder's time by the attribution's cause. A long run's
//! account is millions of moments, so each is kept in 16 bytes, with no
//! more of who decided it than the replay asks: the feeder itself, another
//! thread (a loader it waited on; which ones, the feeder keeps apart), or
//! nobody.

use std::collections::HashMap;

use super::attribute::{Cause, Piece, Tid};

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

/// A moment as kept: its length in a u32 of ns, up to [`LONG`].
#[derive(Clone, Copy)]
struct Packed {
    start: u64,
    len: u32,
    cause: Cause,
    who: Who,
}

const _: () = assert!(std::mem::size_of::<Packed>() == 16);

/// A length that does not fit: the end is in [`Account::long`].
const LONG: u32 = u32::MAX;

/// Moments per block: an account grows by blocks, never by copying itself
/// into one twice its size (a long run's account is hundreds of MiB).
const BLOCK: usize = 1 << 16;

/// The moments, in time order.
#[derive(Default)]
pub struct Account {
    /// Full blocks of [`BLOCK`] moments, then the one being filled.
    moments: Vec<Vec<Packed>>,
    len: usize,
    /// Ends of the moments of 4.3 s or more (start-up, a long wait), by
    /// index.
    long: HashMap<usize, u64>,
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
                self.long.insert(self.len, p.end);
                LONG
            }
        };
        if self.len % BLOCK == 0 {
            self.moments.push(Vec::with_capacity(BLOCK));
        }
        let block = self.moments.last_mut().expect("a block to fill");
        block.push(Packed {
            start: p.start,
            len,
            cause: p.cause,
            who,
        });
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, i: usize) -> Option<Moment> {
        let m = self.moments.get(i / BLOCK)?.get(i % BLOCK)?;
        let end = match m.len {
            LONG => self.long[&i],
            len => m.start + len as u64,
        };
        Some(Moment {
            start: m.start,
            end,
            cause: m.cause,
            who: m.who,
        })
    }

    pub fn first(&self) -> Option<Moment> {
        self.get(0)
    }

    pub fn last(&self) -> Option<Moment> {
        self.get(self.len().checked_sub(1)?)
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Moment> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("in range"))
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
