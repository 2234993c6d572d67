//! The server's request dispatch.
