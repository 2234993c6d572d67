//! Cutting a TCP GSO super-packet (as a TUN device with `IFF_VNET_HDR` hands it over)
//! at segment boundaries, so that a drop or a loss hits the 1500-byte segments a real
//! link would lose, not the whole 64 KiB.
//!
//! A piece is a valid packet of its own: the IP length (and IPv4 header checksum and
//! id), the TCP sequence number and flags are those the kernel's own segmentation would
//! give its first segment, the TCP checksum field holds the pseudo-header sum the
//! checksum offload expects, and a piece of one segment is no longer marked GSO.

use crate::sys::VNET_HDR_LEN;

const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
const GSO_ECN: u8 = 0x80;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Where the parts of a TCP GSO packet are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TcpGso {
    v6: bool,
    /// Offsets in the packet (which starts with the virtio header).
    l4: usize,
    payload: usize,
    len: usize,
    mss: usize,
}

impl TcpGso {
    /// The layout of `packet` if it is a TCP GSO packet of more than one segment.
    pub fn parse(packet: &[u8]) -> Option<TcpGso> {
        let hdr = packet.get(..VNET_HDR_LEN)?;
        let v6 = match hdr[1] & !GSO_ECN {
            GSO_TCPV4 => false,
            GSO_TCPV6 => true,
            _ => return None,
        };
        let mss = u16::from_ne_bytes([hdr[4], hdr[5]]) as usize;
        let ip = VNET_HDR_LEN;
        let version = packet.get(ip)? >> 4;
        let l4 = match (v6, version) {
            // A header shorter than 20 bytes is malformed: leave the packet whole.
            (false, 4) if packet[ip] & 0x0f >= 5 => ip + ((packet[ip] & 0x0f) as usize) * 4,
            // Extension headers are not expected on TSO packets; leave those whole.
            (true, 6) if *packet.get(ip + 6)? == 6 => ip + 40,
            _ => return None,
        };
        let tcp_header = ((*packet.get(l4 + 12)? >> 4) as usize) * 4;
        if tcp_header < 20 {
            return None;
        }
        let payload = l4 + tcp_header;
        let gso = TcpGso {
            v6,
            l4,
            payload,
            len: packet.len(),
            mss,
        };
        (mss > 0 && payload < packet.len() && gso.segments() > 1).then_some(gso)
    }

    /// Number of MSS-sized segments (the last may be shorter).
    pub fn segments(&self) -> usize {
        (self.len - self.payload).div_ceil(self.mss)
    }

    /// Bytes the segments `first..first + count` take on the wire (each with headers).
    pub fn wire_bytes(&self, first: usize, count: usize) -> usize {
        let (start, end) = self.payload_range(first, count);
        (end - start) + count * (self.payload - VNET_HDR_LEN)
    }

    fn payload_range(&self, first: usize, count: usize) -> (usize, usize) {
        let start = self.payload + first * self.mss;
        let end = (start + count * self.mss).min(self.len);
        (start, end)
    }

    /// Writes into `out` the packet that carries segments `first..first + count` of
    /// `packet` (which `self` was parsed from).
    pub fn piece(&self, packet: &[u8], first: usize, count: usize, out: &mut Vec<u8>) {
        let (start, end) = self.payload_range(first, count);
        out.clear();
        out.extend_from_slice(&packet[..self.payload]);
        out.extend_from_slice(&packet[start..end]);
        let last = first + count == self.segments();
        if count == 1 {
            // One segment: a plain packet that still asks for the checksum offload.
            out[1] = GSO_NONE;
            out[4..6].copy_from_slice(&0u16.to_ne_bytes());
        }
        let ip = VNET_HDR_LEN;
        let ip_len = out.len() - ip;
        let tcp_len = out.len() - self.l4;
        if self.v6 {
            put_u16(out, ip + 4, (ip_len - 40) as u16);
        } else {
            put_u16(out, ip + 2, ip_len as u16);
            let id = get_u16(out, ip + 4).wrapping_add(first as u16);
            put_u16(out, ip + 4, id);
            put_u16(out, ip + 10, 0);
            let sum = !fold(sum16(&out[ip..self.l4]));
            put_u16(out, ip + 10, sum);
        }
        let seq = u32::from_be_bytes(out[self.l4 + 4..self.l4 + 8].try_into().unwrap_or([0; 4]));
        let seq = seq.wrapping_add((first * self.mss) as u32);
        out[self.l4 + 4..self.l4 + 8].copy_from_slice(&seq.to_be_bytes());
        let flags = self.l4 + 13;
        if first > 0 {
            out[flags] &= !TCP_CWR;
        }
        if !last {
            out[flags] &= !(TCP_FIN | TCP_PSH);
        }
        let pseudo = self.pseudo_header_sum(out, tcp_len);
        put_u16(out, self.l4 + 16, fold(pseudo));
    }

    /// The (uncomplemented) pseudo-header sum a CHECKSUM_PARTIAL packet carries in its
    /// TCP checksum field.
    fn pseudo_header_sum(&self, out: &[u8], tcp_len: usize) -> u32 {
        let ip = VNET_HDR_LEN;
        let addrs = if self.v6 {
            &out[ip + 8..ip + 40]
        } else {
            &out[ip + 12..ip + 20]
        };
        sum16(addrs) + 6 + tcp_len as u32
    }
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// One's-complement sum of big-endian 16-bit words, not yet folded.
fn sum16(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]) as u32)
        .sum()
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A TCP/IPv4 GSO packet of `segments` × 1448 bytes (the last `short` bytes shorter),
    /// with timestamps (32-byte TCP header), PSH|ACK, seq 1000, IP id 7.
    pub(crate) fn tcp4_gso(segments: usize, short: usize) -> Vec<u8> {
        let payload = segments * 1448 - short;
        let mut p = vec![0u8; VNET_HDR_LEN + 52 + payload];
        p[0] = 1; // NEEDS_CSUM
        p[1] = GSO_TCPV4;
        p[2..4].copy_from_slice(&52u16.to_ne_bytes());
        p[4..6].copy_from_slice(&1448u16.to_ne_bytes());
        let ip = VNET_HDR_LEN;
        p[ip] = 0x45;
        put_u16(&mut p, ip + 2, (52 + payload) as u16);
        put_u16(&mut p, ip + 4, 7);
        p[ip + 8] = 64;
        p[ip + 9] = 6;
        p[ip + 12..ip + 16].copy_from_slice(&[198, 18, 0, 2]);
        p[ip + 16..ip + 20].copy_from_slice(&[198, 18, 0, 1]);
        let tcp = ip + 20;
        p[tcp + 4..tcp + 8].copy_from_slice(&1000u32.to_be_bytes());
        p[tcp + 12] = 8 << 4;
        p[tcp + 13] = TCP_PSH | 0x10;
        for (i, b) in p[VNET_HDR_LEN + 52..].iter_mut().enumerate() {
            *b = (i / 1448) as u8; // each segment's bytes hold its index
        }
        p
    }

    #[test]
    fn pieces_carry_their_segments_with_fixed_headers() {
        let packet = tcp4_gso(5, 100);
        let gso = TcpGso::parse(&packet).unwrap();
        assert_eq!(gso.segments(), 5);
        assert_eq!(gso.wire_bytes(0, 5), 5 * 1500 - 100);
        let mut out = Vec::new();

        // Segments 1 and 2: still GSO, no PSH, seq advanced by one MSS, id by one.
        gso.piece(&packet, 1, 2, &mut out);
        let ip = VNET_HDR_LEN;
        assert_eq!(out.len(), VNET_HDR_LEN + 52 + 2 * 1448);
        assert_eq!(out[1], GSO_TCPV4);
        assert_eq!(get_u16(&out, ip + 2) as usize, 52 + 2 * 1448);
        assert_eq!(get_u16(&out, ip + 4), 8);
        assert_eq!(
            fold(sum16(&out[ip..ip + 20])),
            0xffff,
            "IPv4 header checksum"
        );
        let seq = u32::from_be_bytes(out[ip + 24..ip + 28].try_into().unwrap());
        assert_eq!(seq, 1000 + 1448);
        assert_eq!(out[ip + 33] & TCP_PSH, 0);
        assert!(out[ip + 52..ip + 52 + 1448].iter().all(|&b| b == 1));
        assert!(out[ip + 52 + 1448..].iter().all(|&b| b == 2));
        let pseudo = sum16(&[198, 18, 0, 2, 198, 18, 0, 1]) + 6 + (32 + 2 * 1448) as u32;
        assert_eq!(get_u16(&out, ip + 36), fold(pseudo));

        // The short last segment alone: a plain packet, PSH kept.
        gso.piece(&packet, 4, 1, &mut out);
        assert_eq!(out[1], GSO_NONE);
        assert_eq!(out.len(), VNET_HDR_LEN + 52 + 1448 - 100);
        assert_ne!(out[ip + 33] & TCP_PSH, 0);
        assert!(out[ip + 52..].iter().all(|&b| b == 4));
    }

    #[test]
    fn only_multi_segment_tcp_gso_parses() {
        assert!(TcpGso::parse(&tcp4_gso(1, 0)).is_none());
        let mut udp = tcp4_gso(3, 0);
        udp[1] = 5; // VIRTIO_NET_HDR_GSO_UDP_L4
        assert!(TcpGso::parse(&udp).is_none());
        assert!(TcpGso::parse(&[0u8; 12]).is_none());
        let mut short_tcp = tcp4_gso(3, 0);
        short_tcp[VNET_HDR_LEN + 20 + 12] = 2 << 4; // data offset 8 bytes
        assert!(TcpGso::parse(&short_tcp).is_none());
        let mut short_ip = tcp4_gso(3, 0);
        short_ip[VNET_HDR_LEN] = 0x41; // IHL 4 bytes
        assert!(TcpGso::parse(&short_ip).is_none());
    }
}
