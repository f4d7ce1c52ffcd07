//! Any text as a gateway config, and as a simulator fleet: an error or a config, never a panic;
//! and every error's field path (the first and those it carries) can be looked up in the text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(err) = tpsgate::config::parse(text, |_| Some("key".to_owned())) {
        let _ = tpsgate::yaml::place(err, std::path::Path::new("fuzz.yaml"), text).to_string();
    }
    if let Ok(fleet) = tpsgate::yaml::from_str::<tpsgate::sim::FleetRaw>(text) {
        let _ = fleet.validate();
    }
});
