//! Unit tests of publisher URLs: durations, percent-decoding, parameter checks.

use super::*;

#[test]
fn duration_params_take_the_one_grammar() {
    use std::time::Duration;
    let u = parse("nats://h?a=5s&b=1m30s&c=250ms&d=1d&e=5000&f=0&g=forever&h=2d&i=1.5s").unwrap();
    let d = |name: &str| u.duration_param(name, Duration::from_secs(1));
    assert_eq!(d("a").unwrap(), Duration::from_secs(5));
    assert_eq!(d("b").unwrap(), Duration::from_secs(90));
    assert_eq!(d("c").unwrap(), Duration::from_millis(250));
    assert_eq!(d("d").unwrap(), Duration::from_secs(86_400));
    assert_eq!(d("i").unwrap(), Duration::from_millis(1500));
    assert_eq!(d("nope").unwrap(), Duration::from_secs(1));
    // A bare number once meant milliseconds: refused, with the spellings to use.
    let e = d("e").unwrap_err().to_string();
    assert!(e.contains("`e`") && e.contains("5000ms"), "{e}");
    for bad in ["f", "g", "h"] {
        let e = d(bad).unwrap_err().to_string();
        assert!(e.contains(&format!("`{bad}`")), "{e}");
    }
}

#[test]
fn percent_decodes_userinfo() {
    assert_eq!(percent_decode("p%40ss%3Aw0rd"), "p@ss:w0rd");
    assert_eq!(percent_decode("a+b%2"), "a+b%2");
    assert_eq!(percent_decode("%zz%41"), "%zzA");
}

#[test]
fn params_are_checked() {
    let u = parse("nats://h:1?stream=S&x=1").unwrap();
    assert_eq!(u.param("stream"), Some("S"));
    let e = u.only_params(&["stream"]).unwrap_err().to_string();
    assert!(e.contains("`x`"), "{e}");
    assert!(parse("nats://h?a=1&a=2").is_err());
    let u = parse("null:?ack=maybe").unwrap();
    assert!(u.bool_param("ack", true).is_err());
}
