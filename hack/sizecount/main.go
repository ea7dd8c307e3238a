// Command sizecount prints the size figures of Go source that hack/size.sh
// cannot get from coreutils: the exported API of a set of packages and the
// length of their functions. It reads only the files it is given (test
// files are skipped), with go/parser alone: no type checking, no build
// constraints.
//
//	go run ./hack/sizecount exported FILE...
//	go run ./hack/sizecount longest N FILE...
//	go run ./hack/sizecount over N FILE...
//
// exported prints, per directory and in total, the exported declarations as
// go doc shows them: top-level funcs, methods of exported types, types, and
// each const and var name (a grouped block counts each name). Exported
// methods of unexported types (which go doc does not show) are listed
// apart and left out of the total. Interface methods and struct fields are
// parts of their type's declaration, not declarations: not counted.
//
// longest prints the N longest functions and methods, and over those longer
// than N lines, one per line as "lines file:line name", longest first; a
// function's lines run from its func keyword to its closing brace (function
// literals count within their enclosing function).
package main

import (
	"cmp"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "exported":
		err = exported(args)
	case "longest", "over":
		var n int
		n, err = strconv.Atoi(args[0])
		if err == nil {
			err = funcs(cmd, n, args[1:])
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sizecount:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sizecount exported FILE... | longest N FILE... | over N FILE...")
	os.Exit(2)
}

// parse parses the non-test files among paths.
func parse(paths []string) (*token.FileSet, []*ast.File, error) {
	fset := token.NewFileSet()
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, f)
	}
	return fset, files, nil
}

// counts are one package's exported declarations.
type counts struct {
	funcs, methods, types, consts, vars int
	hidden                              map[string]int // exported methods by unexported type
}

func (c counts) total() int { return c.funcs + c.methods + c.types + c.consts + c.vars }

func exported(paths []string) error {
	fset, files, err := parse(paths)
	if err != nil {
		return err
	}
	byDir := map[string]*counts{}
	for _, f := range files {
		dir := filepath.Dir(fset.Position(f.Package).Filename)
		c := byDir[dir]
		if c == nil {
			c = &counts{hidden: map[string]int{}}
			byDir[dir] = c
		}
		countFile(c, f)
	}
	var all counts
	var hidden []string
	for _, dir := range slices.Sorted(maps.Keys(byDir)) {
		c := byDir[dir]
		fmt.Printf("%-24s %4d  (funcs %d, methods %d, types %d, consts %d, vars %d)\n",
			dir, c.total(), c.funcs, c.methods, c.types, c.consts, c.vars)
		all.funcs += c.funcs
		all.methods += c.methods
		all.types += c.types
		all.consts += c.consts
		all.vars += c.vars
		for _, typ := range slices.Sorted(maps.Keys(c.hidden)) {
			hidden = append(hidden, fmt.Sprintf("%s.%s %d", dir, typ, c.hidden[typ]))
		}
	}
	fmt.Printf("%-24s %4d  (funcs %d, methods %d, types %d, consts %d, vars %d)\n",
		"total", all.total(), all.funcs, all.methods, all.types, all.consts, all.vars)
	if len(hidden) > 0 {
		fmt.Printf("not counted, exported methods of unexported types (go doc hides them):\n  %s\n", strings.Join(hidden, ", "))
	}
	return nil
}

func countFile(c *counts, f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				c.funcs++
			} else if recv := recvType(d); ast.IsExported(recv) {
				c.methods++
			} else {
				c.hidden[recv]++
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						c.types++
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if !n.IsExported() {
							continue
						}
						if d.Tok == token.CONST {
							c.consts++
						} else {
							c.vars++
						}
					}
				}
			}
		}
	}
}

// recvType returns the name of d's receiver's type, without pointer or
// type parameters.
func recvType(d *ast.FuncDecl) string {
	t := d.Recv.List[0].Type
	for {
		switch e := t.(type) {
		case *ast.StarExpr:
			t = e.X
		case *ast.ParenExpr:
			t = e.X
		case *ast.IndexExpr:
			t = e.X
		case *ast.IndexListExpr:
			t = e.X
		case *ast.Ident:
			return e.Name
		default:
			return "?"
		}
	}
}

// fn is one function or method and its length.
type fn struct {
	pos   token.Position
	name  string
	lines int
}

// funcs prints the n longest functions (cmd "longest") or those over n
// lines (cmd "over").
func funcs(cmd string, n int, paths []string) error {
	fset, files, err := parse(paths)
	if err != nil {
		return err
	}
	var all []fn
	for _, f := range files {
		for _, d := range f.Decls {
			d, ok := d.(*ast.FuncDecl)
			if !ok || d.Body == nil {
				continue
			}
			start, end := fset.Position(d.Pos()), fset.Position(d.End())
			name := d.Name.Name
			if d.Recv != nil {
				name = recvString(d.Recv.List[0].Type) + "." + name
			}
			all = append(all, fn{pos: start, name: name, lines: end.Line - start.Line + 1})
		}
	}
	slices.SortFunc(all, func(a, b fn) int {
		return cmp.Or(b.lines-a.lines, cmp.Compare(a.pos.Filename, b.pos.Filename), a.pos.Line-b.pos.Line)
	})
	for i, f := range all {
		if cmd == "longest" && i == n || cmd == "over" && f.lines <= n {
			break
		}
		fmt.Printf("%4d  %s:%d  %s\n", f.lines, f.pos.Filename, f.pos.Line, f.name)
	}
	return nil
}

// recvString renders a receiver type as go doc names methods: (*T).M for
// a pointer receiver, T.M otherwise; type parameters are dropped.
func recvString(t ast.Expr) string {
	if s, ok := t.(*ast.StarExpr); ok {
		return "(*" + recvString(s.X) + ")"
	}
	switch e := t.(type) {
	case *ast.ParenExpr:
		return recvString(e.X)
	case *ast.IndexExpr:
		return recvString(e.X)
	case *ast.IndexListExpr:
		return recvString(e.X)
	case *ast.Ident:
		return e.Name
	}
	return "?"
}
