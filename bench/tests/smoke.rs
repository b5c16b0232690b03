//! The CI smoke run: the harness in `--quick` mode produces every figure, with finite numbers.
//! No timing is asserted.

use std::process::Command;

#[test]
fn quick_run_produces_every_figure() {
    let out = Command::new(env!("CARGO_BIN_EXE_diskless-bench"))
        .arg("--quick")
        .output()
        .expect("running diskless-bench --quick");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    let produced = stdout
        .lines()
        .find_map(|l| l.strip_prefix("figures produced: "))
        .unwrap_or_else(|| panic!("no summary line\n{stdout}\n{stderr}"));
    assert_eq!(
        produced.trim(),
        "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
        "\n{stdout}"
    );
    assert!(
        stdout.contains("rows with non-finite numbers: 0"),
        "non-finite figures:\n{stdout}"
    );
    // Every figure has at least one table row, and no row carries NaN or infinity.
    for figure in 1..=15 {
        let prefix = format!("| {figure} | ");
        assert!(
            stdout.lines().any(|l| l.starts_with(&prefix)),
            "figure {figure} missing:\n{stdout}"
        );
    }
    for line in stdout.lines().filter(|l| l.starts_with("| ")) {
        assert!(!line.contains("NaN") && !line.contains("inf "), "{line}");
    }
    // Figures other than 3, 10, 11 and 14 (which need a PostgreSQL server for some rows) are
    // always measured.
    for line in stdout.lines().filter(|l| l.ends_with("| not measured |")) {
        assert!(
            line.starts_with("| 3 | ")
                || line.starts_with("| 10 | ")
                || line.starts_with("| 11 | ")
                || line.starts_with("| 14 | "),
            "unexpectedly not measured: {line}"
        );
    }
}

#[test]
fn only_selects_figures() {
    let out = Command::new(env!("CARGO_BIN_EXE_diskless-bench"))
        .args(["--quick", "--only", "7"])
        .output()
        .expect("running diskless-bench --quick --only 7");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("figures produced: 7\n"), "{stdout}");
}

#[test]
fn bad_arguments_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_diskless-bench"))
        .args(["--only", "16"])
        .output()
        .expect("running diskless-bench");
    assert_eq!(out.status.code(), Some(2));
}
