//! Integration tests, one binary (linking happens once). Every network test talks only to
//! 127.0.0.1, is bounded in requests and time, and stops by itself.

mod accounting;
mod cached_tokens;
mod campaign;
mod cli;
mod contracts;
mod crash;
mod dataset;
mod dataset_sessions;
mod fault_matrix;
mod faults;
mod floor;
mod freeze;
mod fuzz_corpus;
mod golden;
mod hostile;
mod hostile_peers;
mod mock_prefix;
mod open_loop;
mod plan_campaign;
mod replay;
mod report;
mod scrape;
mod search;
mod second_hour;
mod secrets;
mod serve;
mod serve_lifecycle;
mod sessions;
mod streaming;
mod support;
mod tls;
mod trace;
mod trace_import;
mod verdict;
