//! A small deterministic generator (xorshift) for the seeded stories of the tests: a failing
//! seed replays the same schedule. Shared with `bloodraven-operator`'s lease stress test.

#![allow(dead_code)]

pub struct Rng(u64);

impl Rng {
    /// The generator for `seed` (spread over the bits, never zero).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// `true` with a chance of `percent` in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
