#!/usr/bin/env bash
# Installs what ferry needs on Debian 12, skipping what is already there. Safe to re-run.
set -euo pipefail

# Build: libfabric headers, libclang for bindgen. Run: a font for plots. Benchmark peers
# (`ferry bench`): iperf3, GridFTP (server and globus-url-copy), XRootD (server and xrdcp),
# fio (the disk's own read+write rate, the ceiling of `bench cp`'s disk rows), OpenSSH's
# server and client and rsync (`bench cp`'s encrypted peer: scp, rsync -e ssh). Tests: iproute2
# and iputils-ping for the WAN emulator (ferry-wan's namespaces, RTT checks), jq for its script;
# the NBD clients the block service is tested with (nbdinfo, nbdcopy, nbdsh, nbdfuse, qemu-img;
# fuse2fs for a file system on an export, fuse3's fusermount3 to unmount it as a user) and
# nbdkit and qemu-nbd, its benchmark peers (`ferry bench block`, through fio's nbd engine).
# MPI-IO (libferry-mpiio.so and its tests): Open MPI (mpicc, mpirun), parallel HDF5 and
# PnetCDF with their tools, mpi4py and h5py built for MPI.
packages=(build-essential pkg-config libfabric-dev libfabric-bin libclang-dev fonts-dejavu-core procps
  iperf3 globus-gridftp-server-progs globus-gass-copy-progs xrootd-server xrootd-client fio
  openssh-server openssh-client rsync
  iproute2 iputils-ping jq
  nbdkit libnbd-bin python3-libnbd qemu-utils fuse2fs fuse3
  libopenmpi-dev openmpi-bin libhdf5-openmpi-dev hdf5-tools libpnetcdf-dev pnetcdf-bin
  python3-mpi4py python3-h5py-mpi)

missing=()
for p in "${packages[@]}"; do
  [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == *"ok installed"* ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ferry: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || {
  echo "ferry: Rust (cargo) is required: install it with rustup (https://rustup.rs), then re-run." >&2
  exit 1
}
for c in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" >/dev/null 2>&1 || true
done
