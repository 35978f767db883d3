"""Every case hostile.py runs, in the order it runs them, with its time budget (--list prints
each case's docstring: what it sends and what a robust server does)."""
from .case import Case
from .grpc_cases import (bad_input, big_message_streams, gzip_bomb_grpc, huge_model_name, stream_lockout,
                         zero_infer)
from .h2_cases import (continuation_flood, empty_data_flood, hpack_table_size_flood, idle_after_settings,
                       idle_one_byte, many_idle_connections, ping_flood_no_read, rapid_reset, settings_flood,
                       settings_window_flood, unfinished_header_blocks, zero_window)
from .http_cases import http_deep_pipelining, http_gzip_bomb, http_slowloris, http_stalled_body


CASES = [
    Case("zero_infer", zero_infer, 15),
    Case("gzip_bomb", gzip_bomb_grpc, 20),
    Case("settings_window_flood", settings_window_flood, 20),
    Case("hpack_table_size_flood", hpack_table_size_flood, 15),
    Case("huge_model_name", huge_model_name, 40),
    Case("ping_flood_no_read", ping_flood_no_read, 25),
    Case("unfinished_header_blocks", unfinished_header_blocks, 30),
    Case("big_message_streams", big_message_streams, 15),
    Case("stream_lockout", stream_lockout, 20),
    Case("idle_one_byte", idle_one_byte, 45, slow=True),
    Case("idle_after_settings", idle_after_settings, 45, slow=True),
    Case("http_deep_pipelining", http_deep_pipelining, 15),
    Case("http_stalled_body", http_stalled_body, 45, slow=True),
    Case("bad_input", bad_input, 40),
    Case("rapid_reset", rapid_reset, 20),
    Case("continuation_flood", continuation_flood, 15),
    Case("empty_data_flood", empty_data_flood, 15),
    Case("settings_flood", settings_flood, 20),
    Case("zero_window", zero_window, 20),
    Case("many_idle_connections", many_idle_connections, 30, raise_nofile=True),
    Case("http_slowloris", http_slowloris, 20),
    Case("http_gzip_bomb", http_gzip_bomb, 20),
]
