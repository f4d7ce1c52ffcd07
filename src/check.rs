//! `tpsgate check`: a config validated and summed up, or every error in it, one per line; a
//! simulator fleet's file too.

use std::process::ExitCode;

use crate::console::say;
use crate::sim::FleetRaw;
use crate::yaml;

/// A simulator fleet lists backends by `listen` address; a gateway config by `url`.
fn is_sim_fleet(file: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read_to_string(file) else {
        return false;
    };
    let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(&text) else {
        return false;
    };
    doc.get("backends")
        .and_then(|b| b.as_sequence())
        .and_then(|b| b.first())
        .is_some_and(|first| first.get("listen").is_some() && first.get("url").is_none())
}

/// Checks `file` (without reading the environment's secrets when `no_env`), says what it
/// holds, and exits 1 with its errors when it has any.
pub(crate) fn check(file: &std::path::Path, no_env: bool) -> ExitCode {
    if is_sim_fleet(file) {
        sim_fleet(file)
    } else {
        gateway(file, no_env)
    }
}

fn sim_fleet(file: &std::path::Path) -> ExitCode {
    match yaml::from_file::<FleetRaw>(file).and_then(|f| f.validate().map_err(|e| e.in_file(file)))
    {
        Ok(specs) => {
            say(&format!("{}: ok (simulator fleet)", file.display()));
            for spec in specs {
                say(&format!(
                    "sim backend {} on {}: {}",
                    spec.name,
                    spec.listen,
                    spec.models.join(", ")
                ));
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

fn gateway(file: &std::path::Path, no_env: bool) -> ExitCode {
    let loaded = if no_env {
        crate::config::load_with(file, |_| Some("set-by-check".to_owned()))
    } else {
        crate::config::load(file)
    };
    let config = match loaded {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{err}");
            if err.count() > 1 {
                eprintln!("{} errors", err.count());
            }
            return ExitCode::FAILURE;
        }
    };
    let unchecked = if no_env {
        " (environment variables not read: --no-env)"
    } else {
        ""
    };
    say(&format!("{}: ok{unchecked}", file.display()));
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    say(&format!(
        "listen {scheme}://{}  admin http://{}",
        config.listen, config.admin_listen
    ));
    for b in &config.backends {
        say(&backend_line(b));
    }
    for (a, b) in config.engines_declared_twice() {
        eprintln!(
            "warning: backends {a} and {b} have the same URL in two dialects: one engine split into two curves and two in-flight counts, which misleads the router; declare it once (clients of the other dialect reach it translated: docs/gateway.md, \"Translation between dialects\")"
        );
    }
    for (i, c) in config.classes.iter().enumerate() {
        let default = if config.default_class == Some(i) {
            " (default)"
        } else {
            ""
        };
        say(&format!("class {}{default}", c.name));
    }
    if let Some(c) = &config.cluster {
        say(&format!(
            "cluster {} (key prefix {}, sync every {} ms)",
            crate::config::without_password(c.redis_url.expose()),
            c.key_prefix,
            c.sync_interval.as_millis()
        ));
    }
    ExitCode::SUCCESS
}

/// One backend as `check` shows it: dialect, URL, where a path goes when it is reshaped, how it
/// is discovered, its models.
fn backend_line(b: &crate::config::BackendConfig) -> String {
    let mut models: Vec<String> = b
        .models
        .aliases
        .iter()
        .map(|(client, upstream)| {
            if client == upstream {
                client.clone()
            } else {
                format!("{client} -> {upstream}")
            }
        })
        .collect();
    if b.models.passthrough {
        models.push("* (any, passed through)".to_owned());
    }
    let dialect = match b.dialect {
        crate::config::BackendDialect::Openai => "openai",
        crate::config::BackendDialect::Anthropic => "anthropic",
    };
    let key = if b.api_key.is_some() { ", key set" } else { "" };
    // Where a client's /v1/chat/completions goes, when the backend reshapes the path.
    let shape = match (&b.path_prefix, &b.query) {
        (None, None) => String::new(),
        (prefix, query) => format!(
            ", /v1/chat/completions -> {}{}/chat/completions{}",
            b.url.path().trim_end_matches('/'),
            prefix.as_deref().unwrap_or("/v1"),
            query.as_deref().map_or(String::new(), |q| format!("?{q}"))
        ),
    };
    let discovered = b.discovery.map_or(String::new(), |d| {
        format!(
            ", one backend per address of {} (DNS, every {} s)",
            b.url.host().unwrap_or_default(),
            d.refresh.as_secs_f64()
        )
    });
    format!(
        "backend {} ({dialect}, {}{key}{shape}{discovered}): {}",
        b.name,
        b.url,
        models.join(", ")
    )
}
