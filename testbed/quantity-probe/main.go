// Prints how k8s.io/apimachinery (the version in go.mod) parses and reads each quantity on
// stdin, one per line ("Q:" before one with spaces): the rows of src/drain/quantity_vectors.tsv.
// Regenerate: grep -v "^#" src/drain/quantity_vectors.tsv | cut -f1 | python3 -c 'import json,sys; [print("Q:"+json.loads(l)) for l in sys.stdin]' | (cd testbed/quantity-probe && go run .)
package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

var reInt = regexp.MustCompile(`i:resource\.int64Amount\{value:(-?\d+), scale:(-?\d+)\}`)

func backend(q resource.Quantity) string {
	s := fmt.Sprintf("%#v", q)
	if strings.Contains(s, "(*inf.Dec)(nil)") {
		m := reInt.FindStringSubmatch(s)
		return fmt.Sprintf("int64{%s,e%s}", m[1], m[2])
	}
	d := q.AsDec()
	return fmt.Sprintf("dec{%s,scale%d}", d.UnscaledBig().String(), d.Scale())
}

func main() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		in := line
		if strings.HasPrefix(line, "Q:") { // quoted form to allow spaces
			in = line[2:]
		}
		q, err := resource.ParseQuantity(in)
		if err != nil {
			e := "?"
			switch err {
			case resource.ErrFormatWrong:
				e = "ErrFormatWrong"
			case resource.ErrNumeric:
				e = "ErrNumeric"
			case resource.ErrSuffix:
				e = "ErrSuffix"
			}
			fmt.Printf("%q\tERR\t%s\n", in, e)
			continue
		}
		b := backend(q)
		q1, _ := resource.ParseQuantity(in)
		q2, _ := resource.ParseQuantity(in)
		q3, _ := resource.ParseQuantity(in)
		q4, _ := resource.ParseQuantity(in)
		fmt.Printf("%q\tOK\tstring=%s\tformat=%s\t%s\tValue=%d\tMilliValue=%d\tScaledValue(Kilo)=%d\n",
			in, q1.String(), q1.Format, b, q2.Value(), q3.MilliValue(), q4.ScaledValue(resource.Kilo))
	}
}
