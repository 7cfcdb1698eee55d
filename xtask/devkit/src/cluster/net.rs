//! Host network preparation and its exact undo.
//!
//! Pods live on our own bridge with no default route; FORWARD drops keep anything from leaving
//! or entering it, and the service range is blackholed so that stray ClusterIP traffic dies on
//! the host. The only way out of a pod is the DNAT of the first service IP to the apiserver on
//! loopback (which needs route_localnet on the bridge).

use std::fs;
use std::process::Command;

use anyhow::{Context, bail};

use super::{APISERVER_PORT, BRIDGE, BRIDGE_CIDR_LEN, BRIDGE_IP, FIRST_SERVICE_IP, SERVICE_CIDR};

fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// An iptables rule: the table, the chain and the rule spec, inserted at the top of the chain.
struct Rule {
    program: &'static str,
    table: &'static str,
    chain: &'static str,
    spec: Vec<String>,
}

fn rules() -> Vec<Rule> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut rules = Vec::new();
    for program in ["iptables", "ip6tables"] {
        rules.push(Rule {
            program,
            table: "filter",
            chain: "FORWARD",
            spec: s(&["-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP"]),
        });
        rules.push(Rule {
            program,
            table: "filter",
            chain: "FORWARD",
            spec: s(&["-o", BRIDGE, "!", "-i", BRIDGE, "-j", "DROP"]),
        });
    }
    rules.push(Rule {
        program: "iptables",
        table: "nat",
        chain: "PREROUTING",
        spec: vec![
            "-i".into(),
            BRIDGE.into(),
            "-d".into(),
            format!("{FIRST_SERVICE_IP}/32"),
            "-p".into(),
            "tcp".into(),
            "--dport".into(),
            "443".into(),
            "-j".into(),
            "DNAT".into(),
            "--to-destination".into(),
            format!("127.0.0.1:{APISERVER_PORT}"),
        ],
    });
    rules
}

fn rule_args<'a>(r: &'a Rule, op: &'a str) -> Vec<&'a str> {
    let mut a = vec!["-w", "-t", r.table, op, r.chain];
    if op == "-I" {
        a.push("1");
    }
    a.extend(r.spec.iter().map(String::as_str));
    a
}

fn bridge_exists() -> bool {
    fs::metadata(format!("/sys/class/net/{BRIDGE}")).is_ok()
}

/// Adds another host address on the bridge (a second node's IP; kubelet wants its node IP
/// on an interface). Removed with the bridge.
pub fn add_address(ip: &str) -> anyhow::Result<()> {
    let addr = format!("{ip}/32");
    let shown = run("ip", &["-4", "addr", "show", "dev", BRIDGE])?;
    if !shown.contains(&format!("inet {addr}")) {
        run("ip", &["addr", "add", &addr, "dev", BRIDGE])?;
    }
    Ok(())
}

/// Creates the bridge, the firewall rules, the blackhole route and the sysctls. Idempotent.
pub fn up() -> anyhow::Result<()> {
    if !bridge_exists() {
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    }
    let addr = format!("{BRIDGE_IP}/{BRIDGE_CIDR_LEN}");
    let shown = run("ip", &["-4", "addr", "show", "dev", BRIDGE])?;
    if !shown.contains(&format!("inet {addr}")) {
        run("ip", &["addr", "add", &addr, "dev", BRIDGE])?;
    }
    run("ip", &["link", "set", BRIDGE, "up"])?;
    for r in rules() {
        if !succeeds(r.program, &rule_args(&r, "-C")) {
            run(r.program, &rule_args(&r, "-I"))?;
        }
    }
    let routes = run("ip", &["route", "show", "type", "blackhole"])?;
    if !routes.lines().any(|l| l.contains(SERVICE_CIDR)) {
        run("ip", &["route", "add", "blackhole", SERVICE_CIDR])?;
    }
    fs::write(
        format!("/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet"),
        "1",
    )
    .context("enabling route_localnet on the bridge")?;
    Ok(())
}

/// Removes everything [`up`] created; missing pieces are fine.
pub fn down() -> anyhow::Result<()> {
    for r in rules() {
        while succeeds(r.program, &rule_args(&r, "-C")) {
            run(r.program, &rule_args(&r, "-D"))?;
        }
    }
    remove_kube_chains()?;
    let routes = run("ip", &["route", "show", "type", "blackhole"])?;
    if routes.lines().any(|l| l.contains(SERVICE_CIDR)) {
        run("ip", &["route", "del", "blackhole", SERVICE_CIDR])?;
    }
    if bridge_exists() {
        run("ip", &["link", "del", BRIDGE])?;
    }
    Ok(())
}

const KUBE_TABLES: &[&str] = &["filter", "nat", "mangle"];

/// `KUBE-*` chains (kube-proxy's) per program and table.
fn kube_chains() -> Vec<(&'static str, &'static str, String)> {
    let mut found = Vec::new();
    for program in ["iptables", "ip6tables"] {
        for table in KUBE_TABLES {
            let Ok(rules) = run(program, &["-w", "-t", table, "-S"]) else {
                continue;
            };
            for l in rules.lines() {
                if let Some(chain) = l.strip_prefix("-N KUBE-") {
                    found.push((program, *table, format!("KUBE-{chain}")));
                }
            }
        }
    }
    found
}

/// Removes what `kube-proxy --cleanup` leaves: jumps into `KUBE-*` chains, then the chains.
fn remove_kube_chains() -> anyhow::Result<()> {
    for program in ["iptables", "ip6tables"] {
        for table in KUBE_TABLES {
            let Ok(rules) = run(program, &["-w", "-t", table, "-S"]) else {
                continue;
            };
            for l in rules.lines() {
                let Some(rest) = l.strip_prefix("-A ") else {
                    continue;
                };
                let Some((chain, spec)) = rest.split_once(' ') else {
                    continue;
                };
                if !chain.starts_with("KUBE-") && spec.contains("-j KUBE-") {
                    // iptables -S quotes comments; re-splitting on quotes keeps them one argument.
                    let mut args = vec![
                        "-w".to_string(),
                        "-t".into(),
                        (*table).into(),
                        "-D".into(),
                        chain.into(),
                    ];
                    args.extend(split_rule(spec));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    run(program, &args)?;
                }
            }
        }
    }
    let chains = kube_chains();
    for (program, table, chain) in &chains {
        run(program, &["-w", "-t", table, "-F", chain])?;
    }
    for (program, table, chain) in &chains {
        run(program, &["-w", "-t", table, "-X", chain])?;
    }
    Ok(())
}

/// Splits an `iptables -S` rule into arguments, honouring double quotes.
fn split_rule(spec: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in spec.chars() {
        match ch {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    args.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        args.push(cur);
    }
    args
}

/// What of ours is still there, for `down` to verify.
pub fn leftovers() -> Vec<String> {
    let mut left = Vec::new();
    if bridge_exists() {
        left.push(format!("bridge {BRIDGE}"));
    }
    for r in rules() {
        if succeeds(r.program, &rule_args(&r, "-C")) {
            left.push(format!(
                "{} -t {} {} {}",
                r.program,
                r.table,
                r.chain,
                r.spec.join(" ")
            ));
        }
    }
    for (program, table, chain) in kube_chains() {
        left.push(format!("{program} -t {table} chain {chain}"));
    }
    if run("ip", &["route", "show", "type", "blackhole"]).is_ok_and(|r| r.contains(SERVICE_CIDR)) {
        left.push(format!("blackhole route {SERVICE_CIDR}"));
    }
    left
}

/// Human-readable state for `status`.
pub fn describe() -> String {
    let rules = rules();
    let present = rules
        .iter()
        .filter(|r| succeeds(r.program, &rule_args(r, "-C")))
        .count();
    format!(
        "bridge {BRIDGE}: {}, firewall rules: {present}/{}",
        if bridge_exists() { "present" } else { "absent" },
        rules.len()
    )
}

#[cfg(test)]
mod tests {
    use super::split_rule;

    #[test]
    fn quoted_comments_stay_one_argument() {
        let args =
            split_rule(r#"-m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#);
        assert_eq!(
            args,
            [
                "-m",
                "comment",
                "--comment",
                "kubernetes service portals",
                "-j",
                "KUBE-SERVICES"
            ]
        );
    }
}
