//! Any bytes, split anywhere, as a backend's answer translated for a client of the other
//! dialect, streamed and whole, both ways, and for a Responses client from either: no panic, and what comes out grows at most linearly
//! with what came in (a tiny event never becomes a huge one).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpsgate::translate::{Direction, ResponseTranslator};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let cut = usize::from(cut) % (rest.len() + 1);
    for direction in [
        Direction::ChatToMessages,
        Direction::MessagesToChat,
        Direction::ResponsesToChat,
        Direction::ResponsesToMessages,
    ] {
        for (streamed, status) in [(true, 200), (false, 200), (false, 529)] {
            let mut t = ResponseTranslator::new(direction, streamed, status, true);
            let mut out = t.frame(&rest[..cut]).len();
            out += t.frame(&rest[cut..]).len();
            out += t.finish().len();
            assert!(out <= 32 * rest.len() + 4096, "{out} bytes out of {}", rest.len());
        }
    }
});
