//! `virt-reaper PARENT -- PROGRAM ARGS…`: the subreaper the session-mode libvirt daemon
//! runs below (virt_launcher::reaper). A binary of its own so that it maps no libvirt.

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let (Some(parent), Some("--"), Some(program)) = (
        argv.get(1).and_then(|p| p.parse().ok()),
        argv.get(2).map(String::as_str),
        argv.get(3),
    ) else {
        eprintln!("usage: virt-reaper PARENT_PID -- PROGRAM [ARGS…]");
        std::process::exit(2);
    };
    std::process::exit(virt_launcher::reaper::run(program, &argv[4..], parent));
}
