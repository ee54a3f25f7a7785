"""UEA .ts and .arff files: univariate and multivariate, variable length (NaN-padded), missing
values, labels; bad files are one-line errors naming the file; a split's series longer than the
training length are cut with a one-line warning."""

import numpy as np
import pytest

from lpcjax.data import DataError, SeriesDataConfig, SeriesSource, read_series

TS_UNIVARIATE = """# a comment
@problemName toy
@timeStamps false
@missing true
@univariate true
@equalLength false
@classLabel true a b
@data
1.0,2.0,3.0:a
4.0,?,6.0,7.0:b
"""

TS_MULTIVARIATE = """@problemName toy
@univariate false
@dimensions 2
@classLabel true 1 2
@data
1,2,3:4,5,6:1
7,8:9,10:2
"""

ARFF_UNIVARIATE = """@relation toy
@attribute t0 numeric
@attribute t1 numeric
@attribute t2 numeric
@attribute target {x,y}
@data
1,2,3,x
4,5,?,y
"""

ARFF_MULTIVARIATE = """@relation toy
@attribute series relational
@attribute t0 numeric
@attribute t1 numeric
@attribute t2 numeric
@end series
@attribute target {1,2}
@data
"1,2,3\\n4,5,6",1
"7,8,?\\n9,10,?",2
"""


def write(path, text):
  path.write_text(text)
  return str(path)


@pytest.mark.parametrize("name,text", [("u.ts", TS_UNIVARIATE), ("u.arff", ARFF_UNIVARIATE)])
def test_univariate_variable_length_and_missing(tmp_path, name, text):
  x, labels = read_series(write(tmp_path / name, text))
  assert x.dtype == np.float32 and x.shape[0] == 2 and x.shape[2] == 1
  np.testing.assert_array_equal(x[0, :3, 0], [1, 2, 3])
  assert np.isnan(x[1, 1 if name.endswith(".ts") else 2, 0])
  if name.endswith(".ts"):
    assert x.shape[1] == 4 and np.isnan(x[0, 3, 0])  # the shorter series is NaN-padded
    assert labels.tolist() == ["a", "b"]
  else:
    assert labels.tolist() == ["x", "y"]


@pytest.mark.parametrize("name,text", [("m.ts", TS_MULTIVARIATE), ("m.arff", ARFF_MULTIVARIATE)])
def test_multivariate_channels_and_padding(tmp_path, name, text):
  x, labels = read_series(write(tmp_path / name, text))
  assert x.shape == (2, 3, 2)
  np.testing.assert_array_equal(x[0], [[1, 4], [2, 5], [3, 6]])
  np.testing.assert_array_equal(x[1, :2], [[7, 9], [8, 10]])
  assert np.isnan(x[1, 2]).all()
  np.testing.assert_array_equal(labels, [1, 2])  # numeric labels are numbers


@pytest.mark.parametrize("name,text,message", [
    ("nodata.ts", "@problemName toy\n1,2:a\n", "expected an @ header"),
    ("stamps.ts", "@timeStamps true\n@data\n(0,1):a\n", "timeStamps"),
    ("word.ts", "@classLabel true a\n@data\n1,oops:a\n", "line 3"),
    ("channels.ts", "@classLabel true a\n@data\n1,2:a\n1,2:3,4:a\n", "different numbers of channels"),
    ("bad.arff", "@relation x\n@attribute t0 numeric\n@data\nfoo\n", "cannot read"),
    ("nolabel.arff", "@relation x\n@attribute t0 numeric\n@data\n1\n", "no nominal"),
])
def test_bad_files_are_one_line_errors(tmp_path, name, text, message):
  path = write(tmp_path / name, text)
  with pytest.raises(DataError, match=message) as error:
    read_series(path)
  assert "\n" not in str(error.value) and str(error.value).startswith(path)


def test_longer_eval_series_are_cut_with_a_warning(tmp_path, capsys):
  train = write(tmp_path / "train.ts", "@classLabel true a b\n@data\n1,2,3:a\n4,5,6:b\n")
  test = write(tmp_path / "test.ts", "@classLabel true a b\n@data\n1,2,3,4,5:a\n4,5,6:b\n")
  source = SeriesSource(SeriesDataConfig(train_file=train, eval_file=test, standardize=False), 0, "eval")
  assert source.x.shape == (2, 3, 1)
  err = capsys.readouterr().err.strip()
  assert err.startswith("warning:") and "1 of 2 series" in err and len(err.splitlines()) == 1
  SeriesSource(SeriesDataConfig(train_file=train, eval_file=train), 0, "eval")
  assert capsys.readouterr().err == ""


@pytest.mark.parametrize("header", ["@classLabel\ttrue a b", "@classLabel"])
def test_ts_headers_with_tabs_or_no_class_list(tmp_path, header):
  x, labels = read_series(write(tmp_path / "t.ts", f"{header}\n@data\n1,2:a\n3,4:b\n"))
  assert x.shape == (2, 2, 1) and labels.tolist() == ["a", "b"]
