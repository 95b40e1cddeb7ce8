//! The `matrix-proxy` binary: all logic lives in the library (`matrix_proxy::cli`).
#![forbid(unsafe_code)]

fn main() {
    let code = matrix_proxy::cli::main_with_args(std::env::args_os().collect());
    std::process::exit(code);
}
