package blockstat

import (
	"bufio"
	"strings"
	"testing"
)

func FuzzParseDiskstats(f *testing.F) {
	f.Add(" 254       0 vda 20413 4468 5270226 14940 6042 21048 5621800 4609 0 5752 20114\n")
	f.Add("7 1 loop1 0 0 0 0 0 0 0 0 0 0 0\nshort\n")
	f.Add("1 x vda 1 2 3 4 5 6 7 8 9 10\n")
	f.Fuzz(func(t *testing.T, in string) {
		ds, err := parseDiskstats(bufio.NewScanner(strings.NewReader(in)))
		if err != nil {
			return
		}
		for d, c := range ds {
			if c.Name == "" {
				t.Fatalf("device %v without a name", d)
			}
		}
	})
}

const sampleFormat = `name: block_rq_complete
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:dev_t dev;	offset:8;	size:4;	signed:0;
	field:sector_t sector;	offset:16;	size:8;	signed:0;
	field:unsigned int nr_sector;	offset:24;	size:4;	signed:0;
	field:char rwbs[10];	offset:34;	size:10;	signed:0;
`

func TestParseFormat(t *testing.T) {
	m, err := parseFormat(bufio.NewScanner(strings.NewReader(sampleFormat)))
	if err != nil {
		t.Fatal(err)
	}
	if m["dev"] != [2]int{8, 4} || m["sector"] != [2]int{16, 8} || m["rwbs"] != [2]int{34, 10} {
		t.Fatalf("%v", m)
	}
	if _, err := parseFormat(bufio.NewScanner(strings.NewReader("\tfield:int x;\toffset:z;\tsize:4;\n"))); err == nil {
		t.Fatal("bad offset accepted")
	}
}

func FuzzParseFormat(f *testing.F) {
	f.Add(sampleFormat)
	f.Add("field:int x;\toffset:-1;\tsize:4;")
	f.Fuzz(func(t *testing.T, in string) {
		m, err := parseFormat(bufio.NewScanner(strings.NewReader(in)))
		if err != nil {
			return
		}
		for name, v := range m {
			if v[0] < 0 || v[1] < 0 || v[0] >= 1<<15 || v[1] >= 1<<15 {
				t.Fatalf("field %s: %v out of range", name, v)
			}
		}
	})
}
