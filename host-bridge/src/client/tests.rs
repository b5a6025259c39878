//! Tests of the client: addresses, the handshake and requests against scripted gateways.

use super::*;

#[test]
fn parses_addresses() {
    assert_eq!(
        "tcp://127.0.0.1:7878".parse::<GatewayAddr>().unwrap(),
        GatewayAddr::Tcp("127.0.0.1:7878".into())
    );
    assert_eq!(
        "unix:///run/spillway.sock".parse::<GatewayAddr>().unwrap(),
        GatewayAddr::Unix("/run/spillway.sock".into())
    );
    assert_eq!(
        "serial:///dev/ttyUSB0?baud=9600"
            .parse::<GatewayAddr>()
            .unwrap(),
        GatewayAddr::Serial {
            path: "/dev/ttyUSB0".into(),
            baud: 9600
        }
    );
    assert_eq!(
        "serial:///dev/ttyS1".parse::<GatewayAddr>().unwrap(),
        GatewayAddr::Serial {
            path: "/dev/ttyS1".into(),
            baud: DEFAULT_BAUD
        }
    );
    for bad in [
        "",
        "tcp://",
        "tcp://host",
        "tcp://host:x",
        "http://a:1",
        "unix://",
        "serial://?baud=1",
        "serial:///dev/x?baud=0",
        "serial:///dev/x?parity=odd",
    ] {
        assert!(bad.parse::<GatewayAddr>().is_err(), "{bad}");
    }
}

#[test]
fn log_id_is_32_hex_digits() {
    assert_eq!(log_id_hex(0xab), "000000000000000000000000000000ab");
    assert_eq!(log_id_hex(u128::MAX).len(), 32);
}

/// A gateway that speaks protocol version 3 is told apart before any `FindOffset` is
/// sent: the search fails with the versions named, and the gateway receives nothing
/// after the Hello.
#[test]
fn find_offset_needs_protocol_version_4() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let gateway = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 256];
        // The leading 0x00 and the Hello frame.
        while got.iter().filter(|&&x| x == 0).count() < 2 {
            let n = s.read(&mut b).unwrap();
            assert!(n > 0, "closed before the Hello");
            got.extend_from_slice(&b[..n]);
        }
        let welcome = Response::Welcome {
            protocol_version: 3,
            log_id: 1,
            gateway_id: "old",
            max_record_bytes: 1024,
            max_frame_bytes: 4096,
        };
        let ext = wire::WelcomeV3 { producer_window: 4 };
        let mut out = [0u8; 128];
        let n = wire::encode_frame(&(welcome, ext), &mut out).unwrap();
        s.write_all(&out[..n]).unwrap();
        // Whatever the client sends before it closes.
        let mut after = Vec::new();
        s.read_to_end(&mut after).unwrap();
        after
    });
    let err = smol::block_on(async {
        let mut c = Client::connect(&GatewayAddr::Tcp(addr), "test", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(c.welcome().protocol_version, 3);
        c.find_offset(0).await.unwrap_err()
    });
    assert!(
        matches!(
            err,
            ClientError::Unsupported {
                needed: 4,
                spoken: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade the gateway"), "{err}");
    assert_eq!(gateway.join().unwrap(), Vec::<u8>::new());
}
