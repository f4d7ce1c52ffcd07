//! A virtual key's secret: 32 bytes from the operating system's random source, shown once as
//! `sk-tps-` and 64 hex digits, and kept only as its SHA-256 digest.
//!
//! A plain hash suffices where a password would need a slow one: the secret has 256 bits of
//! entropy, so nobody who reads the digests (the keys file, Redis) can search the secrets, and a
//! request's key is looked up by its digest in a hash map. Timing tells nothing either: it
//! depends on the digest, which says nothing of how close a guess came to any secret.

use ring::digest::{SHA256, digest as sha256};
use ring::rand::{SecureRandom as _, SystemRandom};

use crate::config::Secret;

/// What every virtual key starts with, so that a leaked one is recognised by secret scanners
/// and by the operator.
pub(crate) const PREFIX: &str = "sk-tps-";

/// A secret's SHA-256 digest.
pub(crate) type Digest = [u8; 32];

/// A fresh secret and its digest; `None` where the system gave no randomness (never on Linux
/// once booted).
pub(crate) fn generate() -> Option<(Secret, Digest)> {
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes).ok()?;
    let secret = format!("{PREFIX}{}", hex(&bytes));
    let digest = digest(secret.as_bytes());
    Some((Secret::new(secret), digest))
}

/// The digest of a presented key.
pub(crate) fn digest(given: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(sha256(&SHA256, given).as_ref());
    out
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// A digest from its hex, as stored.
pub(crate) fn from_hex(text: &str) -> Option<Digest> {
    let text = text.as_bytes();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(text.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_prefixed_random_and_kept_as_its_digest() {
        let (a, da) = generate().unwrap();
        let (b, db) = generate().unwrap();
        assert!(a.expose().starts_with(PREFIX));
        assert_eq!(a.expose().len(), PREFIX.len() + 64);
        assert_ne!(a.expose(), b.expose());
        assert_eq!(digest(a.expose().as_bytes()), da);
        assert_ne!(da, db);
        assert_eq!(from_hex(&hex(&da)), Some(da));
        assert_eq!(from_hex("zz"), None);
    }

    #[test]
    fn the_digest_is_sha256() {
        assert_eq!(
            hex(&digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
