//! The `matrix-proxy` binary: all logic lives in the library (`matrix_proxy::cli`).
#![forbid(unsafe_code)]

/// mimalloc instead of glibc's malloc: rows are allocated on the runtime's threads and
/// freed on the recorder's, and glibc serialises such cross-thread frees on the owning
/// arena's lock (measured in `cargo bench --bench writer`: futex waits inside free).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let code = matrix_proxy::cli::main_with_args(std::env::args_os().collect());
    std::process::exit(code);
}
