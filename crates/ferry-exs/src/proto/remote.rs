//! The remote-memory descriptor adverts carry: the fabric layer's own [`RemoteSlice`], so the
//! core, the runtime and the drivers share one vocabulary (DESIGN.md principle 2). Its
//! sub-ranging refuses offsets and addresses that overflow, since peers choose them.

pub use ferry_fabric::RemoteSlice;
