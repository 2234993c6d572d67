//! The file-transfer conversations as state machines with no I/O: messages and local
//! events in, actions out. The client and server runtimes execute the actions against a
//! link, files and threads; the tests drive them against each other in a seeded simulation.

pub mod serve;
pub mod upload;
