# libferry: the EXS C library. Builds with cargo; installs the library, header and
# pkg-config file under PREFIX (staged under DESTDIR if given).
#
#   make                                  cargo build --release -p ferry-capi
#   make install PREFIX=/usr/local        lib/libferry.so{,.0,.0.1.0}, include/ferry/exs.h,
#                                         lib/pkgconfig/ferry.pc, share/man/man3/exs*.3
#   make uninstall PREFIX=/usr/local
#   make check-c                          C tests against a staged install, every driver

PREFIX     ?= /usr/local
DESTDIR    ?=
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
MANDIR     ?= $(PREFIX)/share/man
CARGO      ?= cargo
INSTALL    ?= install

# The workspace version (Cargo.toml [workspace.package]) names the file; SOMAJOR is the ABI
# major in the SONAME (crates/ferry-capi/build.rs), bumped only when the C ABI breaks.
VERSION  := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
SOMAJOR  := 0
CAPI     := crates/ferry-capi
BUILT    := $(or $(CARGO_TARGET_DIR),target)/release/libferry.so
REALNAME := libferry.so.$(VERSION)
# ferry.pc names its directories relative to ${prefix} when they lie under it.
# One page per family (exs_socket.3, ...) and a .so link page per call, as libfabric does.
MANPAGES := $(wildcard man/man3/exs*.3)
PC_LIBDIR     := $(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))
PC_INCLUDEDIR := $(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))

.PHONY: all build install uninstall check-c

all: build

build:
	$(CARGO) build --release -p ferry-capi

install: build
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
	rm -f $(DESTDIR)$(LIBDIR)/$(REALNAME) $(DESTDIR)$(LIBDIR)/libferry.so.$(SOMAJOR) \
	      $(DESTDIR)$(LIBDIR)/libferry.so $(DESTDIR)$(INCLUDEDIR)/ferry/exs.h \
	      $(DESTDIR)$(PKGCONFIGDIR)/ferry.pc \
	      $(addprefix $(DESTDIR)$(MANDIR)/man3/,$(notdir $(MANPAGES)))
	-rmdir $(DESTDIR)$(INCLUDEDIR)/ferry 2>/dev/null

check-c:
	bash scripts/test-capi.sh
