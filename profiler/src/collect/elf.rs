//! Just enough ELF64 to find what a process's libraries export: the dynamic
//! symbol table, and where a library's addresses start. The file
//! may be anything a process mapped under a library's name: every offset
//! and size is checked against the file before use, and every loop is
//! bounded by the file's size.

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        d.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

const SHT_DYNSYM: u32 = 11;
const PT_LOAD: u32 = 1;
const STT_FUNC: u8 = 2;
const STT_OBJECT: u8 = 1;

/// A little-endian ELF64 image.
pub struct Elf<'a> {
    d: &'a [u8],
}

impl<'a> Elf<'a> {
    pub fn parse(d: &'a [u8]) -> Option<Elf<'a>> {
        // Magic, 64-bit, little-endian.
        (d.get(..6)? == b"\x7fELF\x02\x01").then_some(Elf { d })
    }

    /// The program headers of loadable segments, each as its offset in
    /// the file (bounds-checked: a whole header lies within the file).
    fn load_segments(&self) -> impl Iterator<Item = usize> + '_ {
        let d = self.d;
        let (phoff, phentsize, phnum) = (
            u64_at(d, 32).unwrap_or(0) as usize,
            u16_at(d, 54).unwrap_or(0) as usize,
            u16_at(d, 56).unwrap_or(0) as usize,
        );
        (0..phnum)
            .map_while(move |i| phoff.checked_add(i.checked_mul(phentsize)?))
            .filter(move |&p| p.checked_add(56).is_some_and(|end| end <= d.len()))
            .filter(move |&p| u32_at(d, p) == Some(PT_LOAD))
    }

    /// The lowest address the first loadable segment asks for, page
    /// aligned: what the mapping of file offset 0 stands for.
    pub fn base_vaddr(&self) -> Option<u64> {
        let p = self.load_segments().next()?;
        let vaddr = u64_at(self.d, p + 16)?;
        let align = u64_at(self.d, p + 48)?.max(1);
        Some(vaddr & !(align - 1))
    }

    /// The value of each named function in the dynamic symbol table (the
    /// first definition of a name; None where there is none).
    pub fn functions(&self, names: &[&str]) -> Option<Vec<Option<u64>>> {
        self.defined(names, |t| t == STT_FUNC)
    }

    /// The value of each named function or object in the dynamic symbol
    /// table, None where there is none (or no table).
    pub fn symbols(&self, names: &[&str]) -> Vec<Option<u64>> {
        self.defined(names, |t| t == STT_FUNC || t == STT_OBJECT)
            .unwrap_or_else(|| vec![None; names.len()])
    }

    /// What to add to the file's addresses to get the process's, given that
    /// file offset `offset` is mapped at `start`: from the loadable segment
    /// holding that offset.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let d = self.d;
        self.load_segments().find_map(|p| {
            let (p_offset, p_vaddr, p_filesz) =
                (u64_at(d, p + 8)?, u64_at(d, p + 16)?, u64_at(d, p + 32)?);
            let within = p_offset <= offset && offset < p_offset.checked_add(p_filesz)?;
            within.then(|| start.wrapping_sub(p_vaddr.wrapping_add(offset - p_offset)))
        })
    }

    fn defined(&self, names: &[&str], kind: impl Fn(u8) -> bool) -> Option<Vec<Option<u64>>> {
        let d = self.d;
        let (shoff, shentsize, shnum) = (
            u64_at(d, 40)? as usize,
            u16_at(d, 58)? as usize,
            u16_at(d, 60)? as usize,
        );
        let section = |i: usize| -> Option<(u32, usize, usize, u32, usize)> {
            let s = shoff.checked_add(i.checked_mul(shentsize)?)?;
            if s.checked_add(64)? > d.len() {
                return None;
            }
            Some((
                u32_at(d, s + 4)?,
                u64_at(d, s + 24)? as usize,
                u64_at(d, s + 32)? as usize,
                u32_at(d, s + 40)?,
                u64_at(d, s + 56)? as usize,
            ))
        };
        let (_, symoff, symsize, link, entsize) =
            (0..shnum).find_map(|i| section(i).filter(|s| s.0 == SHT_DYNSYM))?;
        let (_, stroff, strsize, _, _) = section(link as usize)?;
        let strtab = d.get(stroff..stroff.checked_add(strsize)?)?;
        let mut out = vec![None; names.len()];
        // A symbol is 24 bytes; any other size is no table to walk (an entry
        // size of 0 would make every read land in bounds for ever).
        if entsize != 24 || symoff.checked_add(symsize)? > d.len() {
            return None;
        }
        for k in 0..symsize / entsize {
            let s = symoff + k * entsize;
            let (name, info, shndx, value) = (
                u32_at(d, s)? as usize,
                *d.get(s + 4)?,
                u16_at(d, s + 6)?,
                u64_at(d, s + 8)?,
            );
            if !kind(info & 0xf) || shndx == 0 || value == 0 {
                continue;
            }
            let Some(rest) = strtab.get(name..) else {
                continue;
            };
            let name = &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())];
            for (slot, want) in out.iter_mut().zip(names) {
                if slot.is_none() && name == want.as_bytes() {
                    *slot = Some(value);
                }
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's libc: its dlopen, found through the file, is the one
    /// the dynamic linker gave this process.
    #[test]
    fn finds_dlopen_in_this_processs_libc() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let (start, path) = maps
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let path = *f.get(5)?;
                let name = std::path::Path::new(path).file_name()?.to_str()?;
                if !name.starts_with("libc.so") || f[2] != "00000000" {
                    return None;
                }
                let start = u64::from_str_radix(f[0].split('-').next()?, 16).ok()?;
                Some((start, path))
            })
            .expect("libc mapped");
        let data = std::fs::read(path).unwrap();
        let elf = Elf::parse(&data).unwrap();
        let got = elf
            .functions(&["dlopen", "getpid", "no_such_function"])
            .unwrap();
        let bias = start - elf.base_vaddr().unwrap();
        assert_eq!(
            got[1].map(|v| v + bias),
            Some(libc::getpid as *const () as u64)
        );
        assert!(got[0].is_some());
        assert_eq!(got[2], None);
        assert!(Elf::parse(b"not an elf").is_none());
    }

    /// A dynamic symbol table of 2^63 bytes with entries of size 0 (a
    /// crafted file mapped as libc) is no table: refused at once, where it
    /// was walked for ever.
    #[test]
    fn a_crafted_symbol_table_is_refused_not_walked() {
        let mut d = vec![0u8; 4096];
        d[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let put64 =
            |d: &mut [u8], at: usize, v: u64| d[at..at + 8].copy_from_slice(&v.to_le_bytes());
        put64(&mut d, 40, 64); // e_shoff
        d[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        d[60..62].copy_from_slice(&2u16.to_le_bytes()); // e_shnum
                                                        // Section 0: SHT_DYNSYM, offset 256, size 2^63, link 1, entsize 0.
        d[64 + 4..64 + 8].copy_from_slice(&11u32.to_le_bytes());
        put64(&mut d, 64 + 24, 256);
        put64(&mut d, 64 + 32, 1 << 63);
        d[64 + 40..64 + 44].copy_from_slice(&1u32.to_le_bytes());
        put64(&mut d, 64 + 56, 0);
        assert_eq!(Elf::parse(&d).unwrap().functions(&["dlopen"]), None);
        // Entry size right, size past the file: refused too.
        put64(&mut d, 64 + 56, 24);
        assert_eq!(Elf::parse(&d).unwrap().functions(&["dlopen"]), None);
        // Offsets that overflow are refused, not wrapped.
        put64(&mut d, 40, u64::MAX - 8);
        assert_eq!(Elf::parse(&d).unwrap().functions(&["dlopen"]), None);
    }
}
