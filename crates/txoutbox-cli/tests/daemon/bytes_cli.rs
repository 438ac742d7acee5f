//! Binary payloads through the binary: `enqueue --bytes-file` writes the file's bytes with
//! their content type, `events show` prints them as base64 with their length (its JSON as
//! `payload_base64`), and the relay hands NATS JetStream the bytes as they are, with a
//! `content-type` header; bad input is one clear error.
#![allow(clippy::unwrap_used)]

use crate::common::*;

#[tokio::test]
async fn bytes_from_a_file_are_shown_as_base64_and_delivered_as_they_are() {
    let db = TestSchema::migrated().await;
    let dir = std::env::temp_dir().join(unique("txoutbox-bytes"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("order.pb");
    let data = [0x08u8, 0x96, 0x01, 0x00, 0xff, 0x12, 0x02, b'h', b'i'];
    std::fs::write(&file, data).unwrap();
    let enqueue = |extra: &[&str]| {
        let mut args = vec![
            "enqueue",
            "--aggregate-type",
            "order",
            "--aggregate-id",
            "1",
            "--event-type",
            "order.created",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let path = file.to_str().unwrap();
    let args = enqueue(&[
        "--bytes-file",
        path,
        "--content-type",
        "application/x-protobuf",
    ]);
    let out = db
        .cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();

    let out = db.cli(&["events", "show", &id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("payload     base64 CJYBAP8SAmhp (9 bytes, application/x-protobuf)"),
        "{}",
        stdout(&out)
    );
    let out = db.cli(&["events", "show", &id, "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["payload_base64"], "CJYBAP8SAmhp");
    assert_eq!(v["content_type"], "application/x-protobuf");
    assert_eq!(v["payload"], serde_json::Value::Null);

    let stream = TestStream::new().await;
    let out = db
        .cli(&["relay", "--publisher", &stream.publisher_url(), "--drain"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let js = &stream.js;
    let s = js.get_stream(&stream.name).await.unwrap();
    let m = s.get_raw_message(1).await.unwrap();
    assert_eq!(&m.payload[..], &data[..], "the bytes as written");
    assert_eq!(
        m.headers.get("content-type").map(|v| v.as_str()),
        Some("application/x-protobuf")
    );

    for (extra, wanted) in [
        (
            vec!["--bytes-file", "/nonexistent/x.pb", "--content-type", "a/b"],
            "--bytes-file: cannot read /nonexistent/x.pb",
        ),
        (
            vec!["--bytes-file", path, "--content-type", "bad\ttype"],
            "--content-type: content type",
        ),
        (vec!["--bytes-file", path], "--content-type"),
        (
            vec![
                "--payload",
                "{}",
                "--bytes-file",
                path,
                "--content-type",
                "a/b",
            ],
            "--payload",
        ),
    ] {
        let args = enqueue(&extra);
        let out = db
            .cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(wanted), "{extra:?}: {}", stderr(&out));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    stream.cleanup().await;
    db.cleanup().await;
}
