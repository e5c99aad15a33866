//! SHA-256 carried from chunk to chunk (docs/protocol.md §17, "Uploading"). An upload's chunks
//! may reach different replicas, so no replica holds the digest of the chunks before. Each
//! stored chunk carries the digest's state after it (eight 32-bit words, in the
//! `Switchboard-Digest-State` header); the replica that takes the next chunk goes on from it.
//! Every chunk but the last is 128 KiB, a whole number of SHA-256's 64-byte blocks, so the state
//! between chunks is just the compression function's (`sha2::compress256`); the last chunk is
//! padded and the digest finished (FIPS 180-4, 5.1.1).

use sha2::digest::generic_array::GenericArray;

/// SHA-256's initial hash value (FIPS 180-4, 5.3.3).
const H0: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// A SHA-256 part way through: the state after `bytes` bytes, a whole number of blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    state: [u32; 8],
    bytes: u64,
}

impl Default for Running {
    fn default() -> Self {
        Self {
            state: H0,
            bytes: 0,
        }
    }
}

impl Running {
    /// The state a chunk's header carries, after `bytes` bytes of the file: `None` when the
    /// header is not 64 hex digits or `bytes` is not a whole number of blocks.
    pub fn from_header(header: &str, bytes: u64) -> Option<Self> {
        if header.len() != 64 || !bytes.is_multiple_of(64) {
            return None;
        }
        let mut state = [0u32; 8];
        for (word, hex) in state.iter_mut().zip(header.as_bytes().chunks(8)) {
            *word = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
        }
        Some(Self { state, bytes })
    }

    /// The state as a chunk's header carries it.
    pub fn to_header(&self) -> String {
        self.state
            .iter()
            .map(|word| format!("{word:08x}"))
            .collect()
    }

    /// Bytes hashed so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Hashes `data`, a whole number of 64-byte blocks (every chunk but the last). Returns
    /// false, hashing nothing, when it is not.
    pub fn update(&mut self, data: &[u8]) -> bool {
        if !data.len().is_multiple_of(64) {
            return false;
        }
        let blocks: Vec<GenericArray<u8, _>> = data
            .chunks_exact(64)
            .map(GenericArray::clone_from_slice)
            .collect();
        sha2::compress256(&mut self.state, &blocks);
        self.bytes += data.len() as u64;
        true
    }

    /// The digest of everything hashed so far followed by `tail` (the last chunk, any length).
    pub fn finish(mut self, tail: &[u8]) -> [u8; 32] {
        let whole = tail.len() - tail.len() % 64;
        self.update(&tail[..whole]);
        let rest = &tail[whole..];
        let length_bits = (self.bytes + rest.len() as u64).wrapping_mul(8);
        // The rest, a 1 bit, zeros, then the length in bits: one block or two.
        let mut padded = Vec::with_capacity(128);
        padded.extend_from_slice(rest);
        padded.push(0x80);
        while padded.len() % 64 != 56 {
            padded.push(0);
        }
        padded.extend_from_slice(&length_bits.to_be_bytes());
        let blocks: Vec<GenericArray<u8, _>> = padded
            .chunks_exact(64)
            .map(GenericArray::clone_from_slice)
            .collect();
        sha2::compress256(&mut self.state, &blocks);
        let mut digest = [0u8; 32];
        for (out, word) in digest.chunks_mut(4).zip(self.state) {
            out.copy_from_slice(&word.to_be_bytes());
        }
        digest
    }
}

/// A digest in lowercase hex.
pub fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest, Sha256};

    fn reference(data: &[u8]) -> [u8; 32] {
        Sha256::digest(data).into()
    }

    #[test]
    fn the_empty_file_and_block_edges_match_sha2() {
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            assert_eq!(Running::default().finish(&data), reference(&data), "{len}");
        }
    }

    proptest! {
        #[test]
        fn chunked_through_headers_it_matches_sha2(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            chunk_blocks in 1usize..6,
        ) {
            let chunk = chunk_blocks * 64;
            let mut running = Running::default();
            let mut offset = 0;
            // Every chunk but the last goes through a header, as between replicas.
            while data.len() - offset > chunk {
                prop_assert!(running.update(&data[offset..offset + chunk]));
                offset += chunk;
                let header = running.to_header();
                running = Running::from_header(&header, running.bytes()).unwrap();
            }
            prop_assert_eq!(running.finish(&data[offset..]), reference(&data));
        }
    }

    #[test]
    fn a_bad_header_or_a_partial_block_is_refused() {
        assert!(Running::from_header("zz", 0).is_none());
        assert!(Running::from_header(&"0".repeat(64), 63).is_none());
        assert!(Running::from_header(&"g".repeat(64), 0).is_none());
        assert!(!Running::default().update(&[0; 63]));
    }
}
