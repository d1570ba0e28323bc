//! Just enough ELF64 to find exported functions in a shared library: the
//! dynamic symbol table, and where the library's addresses start.

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

const SHT_DYNSYM: u32 = 11;
const PT_LOAD: u32 = 1;
const STT_FUNC: u8 = 2;

/// A little-endian ELF64 image.
pub struct Elf<'a> {
    d: &'a [u8],
}

impl<'a> Elf<'a> {
    pub fn parse(d: &'a [u8]) -> Option<Elf<'a>> {
        // Magic, 64-bit, little-endian.
        (d.get(..6)? == b"\x7fELF\x02\x01").then_some(Elf { d })
    }

    /// The lowest address the first loadable segment asks for, page
    /// aligned: what the mapping of file offset 0 stands for.
    pub fn base_vaddr(&self) -> Option<u64> {
        let d = self.d;
        let (phoff, phentsize, phnum) = (
            u64_at(d, 32)? as usize,
            u16_at(d, 54)? as usize,
            u16_at(d, 56)? as usize,
        );
        (0..phnum).find_map(|i| {
            let p = phoff + i * phentsize;
            (u32_at(d, p)? == PT_LOAD).then(|| {
                let vaddr = u64_at(d, p + 16)?;
                let align = u64_at(d, p + 48)?.max(1);
                Some(vaddr & !(align - 1))
            })?
        })
    }

    /// The value of each named function in the dynamic symbol table (the
    /// first definition of a name; None where there is none).
    pub fn functions(&self, names: &[&str]) -> Option<Vec<Option<u64>>> {
        let d = self.d;
        let (shoff, shentsize, shnum) = (
            u64_at(d, 40)? as usize,
            u16_at(d, 58)? as usize,
            u16_at(d, 60)? as usize,
        );
        let section = |i: usize| -> Option<(u32, usize, usize, u32, usize)> {
            let s = shoff + i * shentsize;
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
        let strtab = d.get(stroff..stroff + strsize)?;
        let mut out = vec![None; names.len()];
        for k in 0..symsize / entsize.max(1) {
            let s = symoff + k * entsize;
            let (name, info, shndx, value) = (
                u32_at(d, s)? as usize,
                *d.get(s + 4)?,
                u16_at(d, s + 6)?,
                u64_at(d, s + 8)?,
            );
            if info & 0xf != STT_FUNC || shndx == 0 || value == 0 {
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
}
