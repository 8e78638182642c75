//! A tiny cursor over the fuzzer's bytes: small integers and "interesting" floats.

/// Reads values from the fuzz input; past the end it yields zeros, so every input decodes.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }

    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// An integer in `0..=max`.
    pub fn upto(&mut self, max: usize) -> usize {
        self.byte() as usize % (max + 1)
    }

    #[allow(dead_code)] // used by one target of the two
    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// A float drawn from a palette of boundary values, small integers and fractions near
    /// them, or raw bit patterns.
    pub fn float(&mut self) -> f64 {
        let sel = self.byte();
        let frac = |b: u8| b as f64 / 64.0 - 2.0;
        match sel % 16 {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => 1e38,
            4 => -1e38,
            5 => f64::MIN_POSITIVE / 4.0, // subnormal
            6 => -1.0,
            7 => {
                let k = self.byte() as i8 as f64;
                k - 1e-9 // just below an integer
            }
            8 => {
                let k = self.byte() as i8 as f64;
                k + 1e-9 // just above an integer
            }
            9 => (self.byte() as i8) as f64, // an exact integer
            10 => {
                let mut b = [0u8; 8];
                for x in &mut b {
                    *x = self.byte();
                }
                f64::from_le_bytes(b) // raw bits
            }
            11 => {
                let mut b = [0u8; 4];
                for x in &mut b {
                    *x = self.byte();
                }
                f32::from_le_bytes(b) as f64
            }
            _ => frac(self.byte()),
        }
    }
}
