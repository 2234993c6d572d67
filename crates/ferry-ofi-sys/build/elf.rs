//! Just enough of an ELF reader for the build script: the symbol versions an executable
//! requires (`.gnu.version_r`), per dynamic symbol. 64-bit ELF, either byte order.

/// One dynamic symbol's required version: (symbol, file that provides it, version name).
pub struct Needed {
    pub symbol: String,
    pub file: String,
    pub version: String,
}

const SHT_DYNSYM: u32 = 11;
const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
const SHT_GNU_VERSYM: u32 = 0x6fff_ffff;

struct Reader<'a> {
    data: &'a [u8],
    little: bool,
}

struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
    info: u32,
}

impl<'a> Reader<'a> {
    fn bytes<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        self.data.get(at..at.checked_add(N)?)?.try_into().ok()
    }
    fn u16(&self, at: usize) -> Option<u16> {
        let b = self.bytes::<2>(at)?;
        Some(if self.little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        })
    }
    fn u32(&self, at: usize) -> Option<u32> {
        let b = self.bytes::<4>(at)?;
        Some(if self.little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    }
    fn u64(&self, at: usize) -> Option<usize> {
        let b = self.bytes::<8>(at)?;
        let v = if self.little {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        };
        usize::try_from(v).ok()
    }
    fn str(&self, table: &Section, at: u32) -> Option<String> {
        let start = table.offset.checked_add(usize::try_from(at).ok()?)?;
        let end = table.offset.checked_add(table.size)?;
        let bytes = self.data.get(start..end)?;
        let len = bytes.iter().position(|&b| b == 0)?;
        String::from_utf8(bytes[..len].to_vec()).ok()
    }
    fn sections(&self) -> Option<Vec<Section>> {
        let shoff = self.u64(0x28)?;
        let shentsize = usize::from(self.u16(0x3a)?);
        let shnum = usize::from(self.u16(0x3c)?);
        (0..shnum)
            .map(|i| {
                let at = shoff.checked_add(i.checked_mul(shentsize)?)?;
                Some(Section {
                    kind: self.u32(at + 4)?,
                    offset: self.u64(at + 24)?,
                    size: self.u64(at + 32)?,
                    link: self.u32(at + 40)?,
                    info: self.u32(at + 44)?,
                })
            })
            .collect()
    }
}

/// Every versioned dynamic symbol reference of the 64-bit ELF file `data`; `None` if the
/// file cannot be read as one.
pub fn needed_versions(data: &[u8]) -> Option<Vec<Needed>> {
    if data.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let little = match data.get(5)? {
        1 => true,
        2 => false,
        _ => return None,
    };
    let r = Reader { data, little };
    let sections = r.sections()?;
    let find = |kind| sections.iter().find(|s| s.kind == kind);
    let (Some(dynsym), Some(versym)) = (find(SHT_DYNSYM), find(SHT_GNU_VERSYM)) else {
        return Some(Vec::new());
    };
    let Some(verneed) = find(SHT_GNU_VERNEED) else {
        return Some(Vec::new());
    };
    let dynstr = sections.get(usize::try_from(dynsym.link).ok()?)?;
    let verstr = sections.get(usize::try_from(verneed.link).ok()?)?;

    // Version index -> (file, version name), from the Elf64_Verneed / Elf64_Vernaux chains.
    let mut names = Vec::new();
    let mut need = verneed.offset;
    for _ in 0..verneed.info {
        let cnt = r.u16(need + 2)?;
        let file = r.str(verstr, r.u32(need + 4)?)?;
        let mut aux = need.checked_add(usize::try_from(r.u32(need + 8)?).ok()?)?;
        for _ in 0..cnt {
            let index = r.u16(aux + 6)? & 0x7fff;
            names.push((index, file.clone(), r.str(verstr, r.u32(aux + 8)?)?));
            aux = aux.checked_add(usize::try_from(r.u32(aux + 12)?).ok()?)?;
        }
        need = need.checked_add(usize::try_from(r.u32(need + 12)?).ok()?)?;
    }

    let mut out = Vec::new();
    for i in 0..dynsym.size / 24 {
        let index = r.u16(versym.offset.checked_add(i * 2)?)? & 0x7fff;
        if let Some((_, file, version)) = names.iter().find(|(n, _, _)| *n == index) {
            let symbol = r.str(dynstr, r.u32(dynsym.offset.checked_add(i * 24)?)?)?;
            out.push(Needed {
                symbol,
                file: file.clone(),
                version: version.clone(),
            });
        }
    }
    Some(out)
}
