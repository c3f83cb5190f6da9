"""The Python half of bench/rss.sh: sampling a process's memory, a paced
RabbitMQ publisher, the queue's set-up and removal, and the report (figures
and an SVG plot) of one sampled run.

    rss.py ports N                      print N free loopback ports
    rss.py sample PID CSV SECONDS [FILE...]
    rss.py queue declare|depth|delete AMQP_URL QUEUE
    rss.py publish AMQP_URL QUEUE RATE SECONDS DUP_SHARE PREFIX
    rss.py report CSV SVG NAME SERVED UNIT

`sample` reads VmRSS, RssAnon and RssFile from /proc/PID/status once a second
(on a fixed schedule, so slow reads do not stretch the run) together with the
summed size of the files given (a store's database and its WAL), and stops
after SECONDS or when the process is gone.
"""

import csv
import os
import random
import shlex
import socket
import sys
import time

MIB = 1024.0 * 1024.0
# Flat: the fitted growth over the last 80 % of the run stays under this.
FLAT_MIB_PER_MIN = 0.5


def ports(count):
    socks = []
    for _ in range(int(count)):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
    print(" ".join(str(sock.getsockname()[1]) for sock in socks))
    for sock in socks:
        sock.close()


def read_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                fields[name] = int(value.split()[0])
    return fields


def file_bytes(paths):
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except FileNotFoundError:
            pass
    return total


def sample(pid, out, seconds, *files):
    seconds = int(seconds)
    start = time.monotonic()
    with open(out, "w", newline="", encoding="ascii") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", "rss_kib", "anon_kib", "file_kib", "threads", "store_bytes"])
        for tick in range(seconds + 1):
            delay = start + tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                fields = read_status(pid)
            except (FileNotFoundError, ProcessLookupError):
                print(f"sample: process {pid} is gone after {tick} s", file=sys.stderr)
                return 1
            writer.writerow([
                f"{time.monotonic() - start:.2f}",
                fields["VmRSS"],
                fields.get("RssAnon", ""),
                fields.get("RssFile", ""),
                fields.get("Threads", ""),
                file_bytes(files),
            ])
            handle.flush()
    return 0


def connect(url):
    import pika  # pylint: disable=import-outside-toplevel

    return pika.BlockingConnection(pika.URLParameters(url))


def queue(action, url, name):
    connection = connect(url)
    channel = connection.channel()
    if action == "declare":
        channel.queue_declare(queue=name, durable=True)
    elif action == "depth":
        print(channel.queue_declare(queue=name, passive=True).method.message_count)
    elif action == "delete":
        channel.queue_delete(queue=name)
    else:
        raise SystemExit(f"unknown queue action {action}")
    connection.close()


def publish(url, name, rate, seconds, dup_share, prefix):
    """Publishes RATE distinct messages a second for SECONDS, each with its own
    message id; a DUP_SHARE of them is published a second time, about half a
    second later, as a producer's retry would be. Prints what was sent."""
    import pika  # pylint: disable=import-outside-toplevel

    rate, seconds, dup_share = float(rate), float(seconds), float(dup_share)
    connection = connect(url)
    channel = connection.channel()
    random.seed(1)
    tick = 0.01
    start = time.monotonic()
    sent = copies = 0
    pending = []  # (due, message id) of copies to send again
    body_of = '{{"order":"{}","amount":10}}'
    while True:
        now = time.monotonic() - start
        if now >= seconds:
            break
        due = min(int(now * rate), int(seconds * rate))
        while sent < due:
            message_id = f"{prefix}-{sent}"
            channel.basic_publish(
                exchange="",
                routing_key=name,
                body=body_of.format(message_id).encode(),
                properties=pika.BasicProperties(
                    message_id=message_id, content_type="application/json", delivery_mode=1
                ),
            )
            if random.random() < dup_share:
                pending.append((now + 0.5, message_id))
            sent += 1
        while pending and pending[0][0] <= now:
            _, message_id = pending.pop(0)
            channel.basic_publish(
                exchange="",
                routing_key=name,
                body=body_of.format(message_id).encode(),
                properties=pika.BasicProperties(
                    message_id=message_id, content_type="application/json", delivery_mode=1
                ),
            )
            copies += 1
        connection.process_data_events(time_limit=0)
        time.sleep(max(0.0, tick - ((time.monotonic() - start) - now)))
    for _, message_id in pending:
        channel.basic_publish(
            exchange="",
            routing_key=name,
            body=body_of.format(message_id).encode(),
            properties=pika.BasicProperties(
                message_id=message_id, content_type="application/json", delivery_mode=1
            ),
        )
        copies += 1
    connection.close()
    elapsed = time.monotonic() - start
    print(f"published {sent} messages and {copies} second copies in {elapsed:.0f} s "
          f"({(sent + copies) / elapsed:.0f} msg/s)")


def fit(points):
    """Least-squares slope and intercept of (x, y) points."""
    count = len(points)
    mean_x = sum(x for x, _ in points) / count
    mean_y = sum(y for _, y in points) / count
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx if sxx else 0.0
    return slope, mean_y - slope * mean_x


def load(path):
    with open(path, newline="", encoding="ascii") as handle:
        rows = list(csv.DictReader(handle))
    return [
        (float(row["t_s"]) / 60.0, int(row["rss_kib"]) / 1024.0, int(row["store_bytes"]) / MIB)
        for row in rows
    ]


def report(path, svg, name, served, unit):
    """Prints the figures of one run as `key=value` lines and draws its plot."""
    rows = load(path)
    minutes = rows[-1][0]
    served = int(served)
    at_one = min(rows, key=lambda row: abs(row[0] - 1.0))[1]
    end = rows[-1][1]
    peak = max(row[1] for row in rows)
    window = [(t, rss) for t, rss, _ in rows if t >= 0.2 * minutes]
    slope, intercept = fit(window)
    middle = 0.6 * minutes
    early, _ = fit([(t, rss) for t, rss in window if t < middle])
    late, _ = fit([(t, rss) for t, rss in window if t >= middle])
    mean = sum(rss for _, rss in window) / len(window)
    per_minute = served / minutes if minutes else 0.0
    bytes_per = slope * MIB / per_minute if per_minute else float("nan")
    flat = slope < FLAT_MIB_PER_MIN
    figures = {
        "name": name,
        "minutes": f"{minutes:.1f}",
        "served": served,
        "unit": unit,
        "rate_per_s": f"{per_minute / 60.0:.0f}",
        "rss_1min_mib": f"{at_one:.1f}",
        "rss_end_mib": f"{end:.1f}",
        "rss_max_mib": f"{peak:.1f}",
        "growth_mib_per_min": f"{slope:+.3f}",
        "growth_pct_per_min": f"{100.0 * slope / mean:+.2f}",
        "growth_first_half": f"{early:+.3f}",
        "growth_second_half": f"{late:+.3f}",
        "bytes_per_unit": f"{bytes_per:+.2f}",
        "store_end_mib": f"{rows[-1][2]:.0f}",
        "verdict": "flat" if flat else "GROWING",
    }
    for key, value in figures.items():
        print(f"{key}={shlex.quote(str(value))}")
    plot(rows, svg, name, (slope, intercept, 0.2 * minutes, minutes), figures)


def plot(rows, svg, name, line, figures):
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("svg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = "idem-rss"
    times = [row[0] for row in rows]
    rss = [row[1] for row in rows]
    store = [row[2] for row in rows]
    fig, axis = plt.subplots(figsize=(8, 3.6), dpi=100)
    axis.plot(times, rss, color="#3366cc", linewidth=1.2, label="RSS (MiB), sampled each second")
    slope, intercept, start, stop = line
    axis.plot(
        [start, stop], [intercept + slope * start, intercept + slope * stop],
        color="#dd2222", linewidth=1.0, linestyle="--",
        label=f"fit over the last 80 %: {slope:+.3f} MiB/min",
    )
    axis.set_xlabel("minutes")
    axis.set_ylabel("RSS (MiB)")
    axis.set_xlim(0, max(times))
    axis.set_ylim(0, max(rss) * 1.25)
    axis.grid(True, color="#dddddd", linewidth=0.6)
    other = axis.twinx()
    other.plot(times, store, color="#999999", linewidth=1.0, linestyle=":", label="store files (MiB)")
    other.set_ylabel("store files (MiB)", color="#777777")
    other.set_ylim(0, max(max(store), 1.0) * 1.25)
    handles = axis.get_legend_handles_labels()
    extra = other.get_legend_handles_labels()
    axis.legend(handles[0] + extra[0], handles[1] + extra[1], loc="lower right", fontsize=8)
    axis.set_title(
        f"{name}: {int(figures['served']):,} {figures['unit']} in {figures['minutes']} min "
        f"({figures['rate_per_s']}/s)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(svg, metadata={"Date": None})
    plt.close(fig)


def main(argv):
    commands = {"ports": ports, "sample": sample, "queue": queue, "publish": publish, "report": report}
    if len(argv) < 2 or argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    return commands[argv[1]](*argv[2:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
