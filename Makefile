# ferry: the `ferry` command and libferry, the EXS C library. Builds with cargo; installs
# under PREFIX (staged under DESTDIR if given).
#
#   make                                  cargo build --release -p ferry-cli -p ferry-capi
#   make install PREFIX=/usr/local        install-cli and install-lib:
#   make install-cli                      bin/ferry, share/man/man1/ferry*.1, completions
#                                         (bash, zsh, fish), lib/systemd/system/ferry-serve.service,
#                                         share/doc/ferry/ (the guides, a sample serve.toml)
#   make install-lib                      lib/libferry.so{,.0,.0.1.0}, include/ferry/exs.h,
#                                         lib/pkgconfig/ferry.pc, share/man/man3/exs*.3
#   make uninstall PREFIX=/usr/local
#   make check-c                          C tests against a staged install, every driver
#   make build-mpiio                      target/release/libferry-mpiio.so, the MPI-IO
#                                         interposer (needs mpicc: libopenmpi-dev)

PREFIX     ?= /usr/local
DESTDIR    ?=
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
MANDIR     ?= $(PREFIX)/share/man
BINDIR     ?= $(PREFIX)/bin
DOCDIR     ?= $(PREFIX)/share/doc/ferry
DATADIR    ?= $(PREFIX)/share
UNITDIR    ?= $(PREFIX)/lib/systemd/system
CARGO      ?= cargo
INSTALL    ?= install

# The workspace version (Cargo.toml [workspace.package]) names the file; SOMAJOR is the ABI
# major in the SONAME (crates/ferry-capi/build.rs), bumped only when the C ABI breaks.
VERSION  := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
SOMAJOR  := 0
CAPI     := crates/ferry-capi
BUILT    := $(or $(CARGO_TARGET_DIR),target)/release/libferry.so
FERRY    := $(or $(CARGO_TARGET_DIR),target)/release/ferry
GUIDES   := $(wildcard docs/*.md)
REALNAME := libferry.so.$(VERSION)
# ferry.pc names its directories relative to ${prefix} when they lie under it.
# One page per family (exs_socket.3, ...) and a .so link page per call, as libfabric does.
MANPAGES := $(wildcard man/man3/exs*.3)
PC_LIBDIR     := $(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))
PC_INCLUDEDIR := $(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))

.PHONY: all build build-cli build-lib build-mpiio install install-cli install-lib uninstall check-c

all: build

build: build-cli build-lib

build-cli:
	$(CARGO) build --release -p ferry-cli

build-lib:
	$(CARGO) build --release -p ferry-capi

# The interposer: the crate ferry-mpiio (a static library) linked with c/mpiio by mpicc.
build-mpiio:
	$(CARGO) build --release -p ferry-mpiio
	bash c/mpiio/link.sh $(or $(CARGO_TARGET_DIR),target)/release

install: install-cli install-lib

install-cli: build-cli
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(DOCDIR) \
	    $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DATADIR)/bash-completion/completions \
	    $(DESTDIR)$(DATADIR)/zsh/site-functions $(DESTDIR)$(DATADIR)/fish/vendor_completions.d
	$(INSTALL) -m 0755 $(FERRY) $(DESTDIR)$(BINDIR)/ferry
	$(FERRY) manpages $(DESTDIR)$(MANDIR)/man1
	$(FERRY) completions bash > $(DESTDIR)$(DATADIR)/bash-completion/completions/ferry
	$(FERRY) completions zsh > $(DESTDIR)$(DATADIR)/zsh/site-functions/_ferry
	$(FERRY) completions fish > $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/ferry.fish
	sed -e 's|@BINDIR@|$(BINDIR)|g' packaging/ferry-serve.service \
	    > $(DESTDIR)$(UNITDIR)/ferry-serve.service
	$(INSTALL) -m 0644 $(GUIDES) packaging/serve.toml $(DESTDIR)$(DOCDIR)/

install-lib: build-lib
	$(INSTALL) -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/ferry $(DESTDIR)$(PKGCONFIGDIR)
	$(INSTALL) -m 0755 $(BUILT) $(DESTDIR)$(LIBDIR)/$(REALNAME)
	ln -sf $(REALNAME) $(DESTDIR)$(LIBDIR)/libferry.so.$(SOMAJOR)
	ln -sf libferry.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libferry.so
	$(INSTALL) -m 0644 $(CAPI)/include/ferry/exs.h $(DESTDIR)$(INCLUDEDIR)/ferry/exs.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|^libdir=.*|libdir=$(PC_LIBDIR)|' -e 's|^includedir=.*|includedir=$(PC_INCLUDEDIR)|' \
	    $(CAPI)/ferry.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/ferry.pc
	chmod 0644 $(DESTDIR)$(PKGCONFIGDIR)/ferry.pc
	$(INSTALL) -d $(DESTDIR)$(MANDIR)/man3
	$(INSTALL) -m 0644 $(MANPAGES) $(DESTDIR)$(MANDIR)/man3/

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/ferry $(DESTDIR)$(MANDIR)/man1/ferry.1 \
	      $(DESTDIR)$(MANDIR)/man1/ferry-*.1 $(DESTDIR)$(UNITDIR)/ferry-serve.service \
	      $(DESTDIR)$(DATADIR)/bash-completion/completions/ferry \
	      $(DESTDIR)$(DATADIR)/zsh/site-functions/_ferry \
	      $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/ferry.fish
	rm -rf $(DESTDIR)$(DOCDIR)
	rm -f $(DESTDIR)$(LIBDIR)/$(REALNAME) $(DESTDIR)$(LIBDIR)/libferry.so.$(SOMAJOR) \
	      $(DESTDIR)$(LIBDIR)/libferry.so $(DESTDIR)$(INCLUDEDIR)/ferry/exs.h \
	      $(DESTDIR)$(PKGCONFIGDIR)/ferry.pc \
	      $(addprefix $(DESTDIR)$(MANDIR)/man3/,$(notdir $(MANPAGES)))
	-rmdir $(DESTDIR)$(INCLUDEDIR)/ferry 2>/dev/null

check-c:
	bash scripts/test-capi.sh
