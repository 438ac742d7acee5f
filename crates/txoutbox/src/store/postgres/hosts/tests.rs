use super::*;

fn hosts(url: &str) -> Vec<String> {
    HostList::from_url(url)
        .unwrap()
        .hosts()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_list_in_the_authority_gives_each_host_the_urls_other_settings() {
    let list = HostList::from_url(
        "postgres://app:s%40cret@db1:5433,db2,[::1]:6000/shop?sslmode=disable&target_session_attrs=read-write",
    )
    .unwrap();
    assert_eq!(list.hosts(), ["db1:5433", "db2:5432", "[::1]:6000"]);
    assert_eq!(list.target_session_attrs(), TargetSessionAttrs::ReadWrite);
    assert!(list.needs_following());
    for c in &list.candidates {
        assert_eq!(c.opts.get_username(), "app");
        assert_eq!(c.opts.get_database(), Some("shop"));
    }
}

#[test]
fn a_list_in_the_parameters_takes_one_port_for_all_or_one_each() {
    assert_eq!(
        hosts("postgres://app@/shop?host=a,b&port=6001"),
        ["a:6001", "b:6001"]
    );
    assert_eq!(
        hosts("postgres://app@/shop?host=a,b&port=6001,6002"),
        ["a:6001", "b:6002"]
    );
    let err = HostList::from_url("postgres://app@/shop?host=a,b,c&port=1,2")
        .unwrap_err()
        .to_string();
    assert!(err.contains("3 hosts and 2 ports"), "{err}");
}

#[test]
fn one_host_without_attrs_is_used_as_before() {
    let list = HostList::from_url("postgres://app@db/shop").unwrap();
    assert!(!list.needs_following());
    assert_eq!(list.hosts(), ["db:5432"]);
    let one = HostList::from_url("postgres://app@db/shop?target_session_attrs=primary").unwrap();
    assert!(one.needs_following(), "a standby must still be refused");
}

#[test]
fn errors_name_the_part_and_never_the_password() {
    for (url, names) in [
        (
            "postgres://u:hunter2secret@a,b/db?target_session_attrs=standby",
            "target_session_attrs",
        ),
        ("postgres://u:hunter2secret@a:x,b/db", "port"),
        ("postgres://u:hunter2secret@a,,b/db", "empty host"),
        ("postgres://u:hunter2secret@[::1,b/db", "unclosed"),
    ] {
        let err = HostList::from_url(url).unwrap_err().to_string();
        assert!(err.contains(names), "{url}: {err}");
        assert!(!err.contains("hunter2secret"), "{url}: {err}");
    }
}

/// The real server on `DATABASE_URL` is not a standby: a list whose first host does not
/// answer finds it second, and says why it passed over the first.
#[tokio::test]
async fn find_passes_over_a_host_that_does_not_answer() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        return;
    };
    let Ok(u) = url::Url::parse(&url) else {
        return;
    };
    let (Some(host), port) = (u.host_str(), u.port().unwrap_or(5432)) else {
        return;
    };
    let user = match u.password() {
        Some(pw) => format!("{}:{pw}", u.username()),
        None => u.username().to_owned(),
    };
    // Port 1 on loopback refuses at once.
    let listed = format!(
        "postgres://{user}@127.0.0.1:1,{host}:{port}{}?target_session_attrs=read-write",
        u.path()
    );
    let list = HostList::from_url(&listed).unwrap();
    let found = list.find().await.unwrap();
    assert_eq!(found.get_port(), port);
    let none = HostList::from_url(&listed.replacen(&format!(",{host}:{port}"), "", 1)).unwrap();
    let err = none.find().await.unwrap_err().to_string();
    assert!(err.contains("127.0.0.1:1"), "{err}");
}
