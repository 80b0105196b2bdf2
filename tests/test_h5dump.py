"""The HDF5 dump layout helpers: shapes, partial-file bookkeeping for --resume, the token cache."""
import h5py
import numpy as np
import pytest

from elmo_cli import h5dump
from elmo_cli.layers import LayerSelection
from vocab.errors import ElmoError


def test_dataset_shape_and_partial_names(tmp_path):
    assert LayerSelection.parse("all").shape(3, 7, 128) == (3, 7, 128)
    for mode in ("top", "average", "mix"):
        assert LayerSelection(mode).shape(3, 7, 128) == (7, 128)
    assert h5dump.partial_path(tmp_path / "o.hdf5").name == "o.hdf5.partial"
    assert h5dump.partial_path(tmp_path / "o.hdf5", 1).name == "o.hdf5.partial.rank1"


def test_resume_keeps_completed_and_drops_the_rest(tmp_path):
    path = tmp_path / "o.hdf5.partial"
    settings = {"layers": "all", "dtype": "float32"}
    f, done = h5dump.open_partial(path, settings, resume=False)
    assert done == 0
    for i in range(4):
        h5dump.create_line_dataset(f, i, (2, 3), "float16", "gzip")
        h5dump.write_line(f, i, np.full((2, 3), i, dtype=np.float32))
    h5dump.mark_completed(f, 2)
    f.close()
    f, done = h5dump.open_partial(path, settings, resume=True)
    assert done == 2 and sorted(f.keys()) == ["0", "1"]
    assert f["1"].dtype == np.float16 and f["1"][0, 0] == 1
    f.close()
    with pytest.raises(ElmoError, match="dtype"):
        h5dump.open_partial(path, {"layers": "all", "dtype": "float16"}, resume=True)
    f, done = h5dump.open_partial(path, settings, resume=False)  # no --resume: start over
    assert done == 0 and len(f.keys()) == 0
    f.close()


def test_empty_dataset_is_not_chunked_and_sentence_index_round_trips(tmp_path):
    with h5py.File(tmp_path / "o.hdf5", "w") as f:
        h5dump.create_line_dataset(f, 0, (3, 0, 8), "float32", "gzip")
        ds = f["0"]
        assert ds.shape == (3, 0, 8) and ds.compression is None
        mapping = {"naïve café": "0", "北京 .": "1"}
        h5dump.write_sentence_index(f, mapping)
        assert f["sentence_to_index"].shape == (1,)
        assert f["sentence_to_index"].dtype.kind == "O"
        assert h5dump.read_sentence_index(f) == mapping


def test_token_cache_round_trip_and_checks(tmp_path):
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "cache.hdf5"
    h5dump.write_token_cache(path, ["<S>", "é", "</S>"], emb)
    assert not h5dump.partial_path(path).exists()
    tokens, got = h5dump.read_token_cache(path, 4)
    assert tokens == ["<S>", "é", "</S>"] and np.array_equal(got, emb)
    with pytest.raises(ElmoError, match=r"shape \(3, 4\), expected \(3, 5\)"):
        h5dump.read_token_cache(path, 5)
    with h5py.File(tmp_path / "bilm_tf.hdf5", "w") as f:  # bilm-tf's own file: no token list
        f["embedding"] = emb
    with pytest.raises(ElmoError, match="does not list its tokens"):
        h5dump.read_token_cache(tmp_path / "bilm_tf.hdf5", 4)
    assert h5dump.read_token_cache(tmp_path / "bilm_tf.hdf5", 4, ["a", "b", "c"])[0] == ["a", "b", "c"]


def test_write_line_converts_dtype_and_refuses_a_wrong_shape(tmp_path):
    x = np.random.default_rng(0).random((2, 5, 6), dtype=np.float32)[:, 1:]  # a strided view, as the dump gives
    with h5py.File(tmp_path / "a.hdf5", "w") as f:
        h5dump.create_line_dataset(f, 3, (2, 4, 6), "float16")
        h5dump.write_line(f, 3, x)
        assert f["3"].dtype == np.float16
        np.testing.assert_array_equal(f["3"][...], x.astype(np.float16))
        with pytest.raises(OSError, match="different number of elements"):
            h5dump.write_line(f, 3, np.zeros((2, 3, 6), np.float32))


def test_a_line_is_the_bytes_h5pys_create_dataset_and_hdf5s_own_conversion_write(tmp_path):
    """The dump's fast writer (low-level creation, torch's float16 cast in `write_line`) writes, byte for byte,
    the file that h5py's ``create_dataset`` filled through HDF5's own conversion writes: the same layout, link names
    and rounding, empty lines included."""
    rng = np.random.default_rng(1)
    lines = [rng.standard_normal((3, n, 8), dtype=np.float32) * 300 for n in (4, 0, 7, 1)]
    for dtype in ("float32", "float16"):
        made, fast = tmp_path / f"h5py-{dtype}.hdf5", tmp_path / f"fast-{dtype}.hdf5"  # names of one length
        with h5py.File(made, "w", track_order=True) as f:
            for i, x in enumerate(lines):
                f.create_dataset(str(i), shape=x.shape, dtype=h5dump.DTYPES[dtype])
            for i, x in enumerate(lines):
                f[str(i)][...] = x
        with h5py.File(fast, "w", track_order=True) as f:
            for i, x in enumerate(lines):
                h5dump.create_line_dataset(f, i, x.shape, dtype)
            for i, x in enumerate(lines):
                h5dump.write_line(f, i, x)
        assert made.read_bytes() == fast.read_bytes(), dtype
